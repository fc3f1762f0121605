"""Mirror of vllm/v1/engine/core.py: EngineCore and the busy loop that runs it in a child process.

`EngineCore.step()` is the article's three stages: schedule() -> execute_model()
-> update_from_output(). `run_engine_core` is the child's busy loop: drain the
input queue, step while there is work, put EngineCoreOutputs on the output
queue. Left out: ZMQ sockets, data parallelism, batch queues for pipeline
parallelism, async scheduling.
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import traceback

import torch

from minivllm.attention.selector import get_attn_backend_name
from minivllm.config import CacheConfig, EngineConfig
from minivllm.core.sched.scheduler import Scheduler
from minivllm.engine import EngineCoreOutputs, EngineCoreRequest
from minivllm.models.loader import get_model, load_config
from minivllm.request import Request, RequestStatus
from minivllm.worker.model_runner import GPUModelRunner

logger = logging.getLogger("minivllm")

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def keep_freed_memory() -> None:
    """CPU: stop glibc from returning big freed buffers to the OS after every step.

    By default each allocation over 32 MiB is its own mmap, unmapped on free, so every step
    page-faults its large activations in again (measured: the prefill MLP ran ~1.8x slower).
    Serving everything from the heap and never trimming it makes a step reuse last step's memory.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap-backed chunks
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never give the heap top back


def max_model_len_for(config: EngineConfig, hf_config) -> int:
    limit = hf_config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={limit}: lower max_model_len.")
    return config.max_model_len or limit


class EngineCore:
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        torch.manual_seed(config.seed)
        if config.device == "cpu" and os.environ.get("MINIVLLM_KEEP_FREED_MEMORY", "1") != "0":
            keep_freed_memory()
        hf_config = load_config(model_folder)
        self.max_model_len = max_model_len_for(config, hf_config)
        dtype = _DTYPES[config.dtype]
        model = get_model(model_folder, hf_config, self.max_model_len, dtype, config.device)
        self.num_gpu_blocks = config.num_gpu_blocks_override or self._blocks_from_budget(config, hf_config, dtype)
        self.block_size = config.block_size
        self.attention_backend = get_attn_backend_name(config.attention_backend, config.device)
        self.scheduler = Scheduler(config.scheduler_config(self.max_model_len),
                                   CacheConfig(config.block_size, self.num_gpu_blocks))
        self.model_executor = GPUModelRunner(
            model, block_size=config.block_size, num_gpu_blocks=self.num_gpu_blocks,
            max_num_reqs=config.max_num_seqs, max_model_len=self.max_model_len,
            attention_backend=self.attention_backend,
            device=config.device, seed=config.seed)
        self.tracer = None  # set by minivllm.tracing; observes each step, changes nothing
        logger.info("EngineCore ready: %s, %d KV blocks of %d tokens, max_model_len=%d, %s attention",
                    type(model).__name__, self.num_gpu_blocks, config.block_size, self.max_model_len,
                    self.attention_backend)

    @staticmethod
    def _blocks_from_budget(config: EngineConfig, hf_config, dtype: torch.dtype) -> int:
        heads = getattr(hf_config, "num_key_value_heads", hf_config.num_attention_heads)
        head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
        per_block = hf_config.num_hidden_layers * 2 * config.block_size * heads * head_size * dtype.itemsize
        return max(2, config.kv_cache_memory_bytes // per_block)

    def info(self) -> dict:
        return {"max_model_len": self.max_model_len, "num_gpu_blocks": self.num_gpu_blocks,
                "block_size": self.block_size, "attention_backend": self.attention_backend, "pid": os.getpid()}

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request(request.request_id, request.prompt_token_ids, request.sampling_params,
                                           request.eos_token_id, request.priority, request.arrival_time))
        if self.tracer is not None:
            self.tracer.on_add_request(self, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        if self.tracer is not None:
            self.tracer.on_abort(self, request_ids)

    def step(self) -> EngineCoreOutputs:
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(engine_pid=os.getpid(), trace_events=self.drain_trace())
        scheduler_output = self.scheduler.schedule()  # 1. spend the token and block budgets
        if self.tracer is not None:
            self.tracer.on_schedule(self, scheduler_output)
        model_output = self.model_executor.execute_model(scheduler_output)  # 2. forward + sample
        outputs = self.scheduler.update_from_output(scheduler_output, model_output)  # 3. append, stop, free
        if self.tracer is not None:
            self.tracer.on_update(self, scheduler_output, model_output, outputs)
        outputs.engine_pid = os.getpid()
        outputs.trace_events = self.drain_trace()
        return outputs

    def drain_trace(self) -> list:
        """Trace events recorded since the last drain (they ride back with each step's outputs)."""
        return self.tracer.drain() if self.tracer is not None else []

    def get_num_free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def get_stats(self) -> dict:
        return {"num_preemptions": self.scheduler.num_preemptions, "num_free_blocks": self.get_num_free_blocks(),
                "num_gpu_blocks": self.num_gpu_blocks, "num_unfinished": self.scheduler.get_num_unfinished_requests()}

    def enable_tracing(self) -> None:
        from minivllm.tracing.tracer import EngineTracer
        self.tracer = EngineTracer()
        self.model_executor.trace_enabled = True


def run_engine_core(config: EngineConfig, model_folder: str, input_queue, output_queue, parent_pid: int) -> None:
    """The child's busy loop: block for work when idle, otherwise drain inputs and step."""
    from minivllm.logger import init_engine_core_logger
    init_engine_core_logger()
    try:
        core = EngineCore(config, model_folder)
        output_queue.put(("READY", core.info()))
    except BaseException as e:  # a bad model or config: tell the caller, then exit
        refused = isinstance(e, ValueError)  # bad input: the caller gets the ValueError itself
        output_queue.put(("ERROR", str(e) if refused else f"{type(e).__name__}: {e}", refused))
        return
    try:
        while True:
            idle = not core.scheduler.has_unfinished_requests()
            try:
                message = input_queue.get(timeout=1.0) if idle else input_queue.get_nowait()
            except queue.Empty:
                message = None
                if os.getppid() != parent_pid:  # the caller is gone: do not outlive it
                    return
            while message is not None:
                kind, payload = message
                if kind == "SHUTDOWN":
                    return
                if kind == "ADD":
                    for request in payload:
                        core.add_request(request)
                elif kind == "ABORT":
                    core.abort_requests(payload)
                elif kind == "UTILITY":
                    call_id, name, args = payload
                    output_queue.put(("UTILITY", (call_id, getattr(core, name)(*args))))
                try:
                    message = input_queue.get_nowait()
                except queue.Empty:
                    message = None
            if core.scheduler.has_unfinished_requests():
                outputs = core.step()
                if outputs.outputs or outputs.trace_events:
                    output_queue.put(("OUTPUTS", outputs))
    except BaseException:
        output_queue.put(("ERROR", traceback.format_exc(), False))
        raise
