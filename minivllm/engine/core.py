"""Mirror of vllm/v1/engine/core.py: EngineCore and the busy loop that runs it in a child process.

`EngineCore.step()` is the article's three stages: schedule() -> execute_model()
-> update_from_output(). `run_engine_core` starts the child's EngineCore and
`run_busy_loop` runs it: drain the input queue, step while there is work, send
EngineCoreOutputs down the output pipe. Left out: ZMQ sockets, data parallelism, batch queues for pipeline
parallelism, async scheduling.
"""
from __future__ import annotations

import ctypes
import logging
import os
import queue
import random
import signal
import traceback

import numpy as np
import torch

from minivllm import envs
from minivllm.attention.selector import get_attn_backend_name
from minivllm.config import CacheConfig, EngineConfig
from minivllm.core.kv_cache_utils import get_request_block_hasher, max_model_len_for, resolve_sizes
from minivllm.core.sched.scheduler import Scheduler
from minivllm.engine import EngineCoreOutputs, EngineCoreOutputType, EngineCoreRequest, EngineCoreRequestType
from minivllm.models.loader import get_model, load_config
from minivllm.profiler import TorchProfiler
from minivllm.request import Request, RequestStatus
from minivllm.worker.gpu_model_runner import GPUModelRunner

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


def set_random_seed(seed: int) -> None:
    """As vLLM's worker: seed Python's, NumPy's and torch's global generators in this process.

    In-process (MINIVLLM_ENABLE_V1_MULTIPROCESSING=0) that process is the caller's, so a script's own
    `random` calls after LLM(seed=...) repeat run to run, as vLLM's reproducibility example expects.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class EngineCore:
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        set_random_seed(config.seed)
        if config.device == "cpu" and envs.keep_freed_memory():
            keep_freed_memory()
        hf_config = load_config(model_folder)
        dtype = _DTYPES[config.dtype]
        model = get_model(model_folder, hf_config, max_model_len_for(config, hf_config), dtype, config.device)
        # Sized once the weights are in memory: gpu_memory_utilization is a fraction of what is left.
        self.max_model_len, self.num_gpu_blocks = resolve_sizes(config, hf_config)
        self.block_size = config.block_size
        self.attention_backend = get_attn_backend_name(config.attention_backend, config.device)
        self.scheduler = Scheduler(config.scheduler_config(self.max_model_len),
                                   CacheConfig(config.block_size, self.num_gpu_blocks, config.enable_prefix_caching))
        # prefix caching: each Request hashes its full blocks as its tokens arrive (vLLM's request_block_hasher)
        self.request_block_hasher = get_request_block_hasher(config.block_size) \
            if config.enable_prefix_caching else None
        self.model_executor = GPUModelRunner(
            model, block_size=config.block_size, num_gpu_blocks=self.num_gpu_blocks,
            max_num_reqs=config.max_num_seqs, max_model_len=self.max_model_len,
            attention_backend=self.attention_backend,
            device=config.device, seed=config.seed)
        self.tracer = None  # set by minivllm.tracing; observes each step, changes nothing
        self.profiler = TorchProfiler(config.profiler_config, f"EngineCore_pid{os.getpid()}") \
            if config.profiler_config else None
        logger.info("EngineCore ready: %s, %d KV blocks of %d tokens, max_model_len=%d, %s attention",
                    type(model).__name__, self.num_gpu_blocks, config.block_size, self.max_model_len,
                    self.attention_backend)

    def info(self) -> dict:
        return {"max_model_len": self.max_model_len, "num_gpu_blocks": self.num_gpu_blocks,
                "block_size": self.block_size, "attention_backend": self.attention_backend, "pid": os.getpid()}

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request(request.request_id, request.prompt_token_ids, request.sampling_params,
                                           request.eos_token_id, request.priority, request.arrival_time,
                                           block_hasher=self.request_block_hasher))
        if self.tracer is not None:
            self.tracer.on_add_request(self, request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)
        if self.tracer is not None:
            self.tracer.on_abort(self, request_ids)

    def step(self) -> EngineCoreOutputs:
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs(trace_events=self.drain_trace())
        scheduler_output = self.scheduler.schedule()  # 1. spend the token and block budgets
        if self.tracer is not None:
            self.tracer.on_schedule(self, scheduler_output)
        model_output = self.model_executor.execute_model(scheduler_output)  # 2. forward + sample
        outputs = self.scheduler.update_from_output(scheduler_output, model_output)  # 3. append, stop, free
        if self.tracer is not None:
            self.tracer.on_update(self, scheduler_output, model_output, outputs)
        outputs.trace_events = self.drain_trace()
        return outputs

    def drain_trace(self) -> list:
        """Trace events recorded since the last drain (they ride back with each step's outputs)."""
        return self.tracer.drain() if self.tracer is not None else []

    def get_num_free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def get_stats(self) -> dict:
        """Counters since the engine started; the prefix-cache ones (tokens) since the last reset_prefix_cache()."""
        cache = self.scheduler.kv_cache_manager.prefix_cache_stats
        return {"num_preemptions": self.scheduler.num_preemptions, "num_free_blocks": self.get_num_free_blocks(),
                "num_gpu_blocks": self.num_gpu_blocks, "num_unfinished": self.scheduler.get_num_unfinished_requests(),
                "num_running": len(self.scheduler.running), "num_waiting": len(self.scheduler.waiting),
                "prefix_cache_queries": cache.queries, "prefix_cache_hits": cache.hits,
                "prefix_cache_preempted_queries": cache.preempted_queries,
                "prefix_cache_preempted_hits": cache.preempted_hits}

    def reset_prefix_cache(self) -> bool:
        """As vLLM's: forget every cached prefix; False (a no-op) while requests are running."""
        return self.scheduler.reset_prefix_cache()

    def profile(self, is_start: bool = True) -> None:
        """vLLM's EngineCore.profile: start or stop the torch profiler (LLM.start_profile / stop_profile)."""
        if self.profiler is None:
            raise RuntimeError("profiler_config was not set when the engine started")
        self.profiler.start() if is_start else self.profiler.stop()

    def enable_tracing(self) -> None:
        from minivllm.tracing.tracer import EngineTracer
        self.tracer = EngineTracer()
        self.model_executor.trace_enabled = True


def run_engine_core(config: EngineConfig, model_folder: str, input_queue, output_conn, parent_pid: int) -> None:
    """The child process's entry: build EngineCore, report READY, then run the busy loop.

    SIGINT is ignored here: a Ctrl-C in the terminal interrupts the caller's generate(), which
    aborts its requests, while EngineCore lives on for the next call.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from minivllm.logger import init_engine_core_logger
    init_engine_core_logger()
    send = output_conn.send
    try:
        core = EngineCore(config, model_folder)
        send((EngineCoreOutputType.READY, core.info()))
    except BaseException as e:  # a bad model or config: tell the caller, then exit
        refused = isinstance(e, ValueError)  # bad input: the caller gets the ValueError itself
        send((EngineCoreOutputType.ERROR, (str(e) if refused else f"{type(e).__name__}: {e}", refused)))
        return
    try:
        run_busy_loop(core, input_queue, send, parent_pid)
    except (BrokenPipeError, EOFError):
        return  # the caller closed its end: nobody is left to serve
    except BaseException:
        send((EngineCoreOutputType.ERROR, (traceback.format_exc(), False)))
        raise


def run_busy_loop(core: EngineCore, input_queue, send, parent_pid: int) -> None:
    """The article's busy loop: block for work when idle, otherwise take every input that has arrived and step."""
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
            if kind == EngineCoreRequestType.SHUTDOWN:
                return
            if kind == EngineCoreRequestType.ADD:
                for request in payload:
                    core.add_request(request)
            elif kind == EngineCoreRequestType.ABORT:
                core.abort_requests(payload)
            elif kind == EngineCoreRequestType.UTILITY:
                send((EngineCoreOutputType.UTILITY, _call_utility(core, *payload)))
            try:
                message = input_queue.get_nowait()
            except queue.Empty:
                message = None
        if core.scheduler.has_unfinished_requests():
            outputs = core.step()
            if outputs.outputs or outputs.trace_events:
                send((EngineCoreOutputType.OUTPUTS, outputs))


def _call_utility(core: EngineCore, call_id: int, name: str, args: tuple) -> tuple:
    """Run one EngineCore method for the caller; a failure goes back as its message, the engine lives on."""
    try:
        return call_id, None, getattr(core, name)(*args)
    except Exception as e:
        return call_id, f"{type(e).__name__}: {e}", None
