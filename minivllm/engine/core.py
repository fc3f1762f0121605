"""Mirror of vllm/v1/engine/core.py: EngineCore and the busy loop that runs it in a child process.

`EngineCore.step()` is the article's three stages: schedule() -> execute_model()
-> update_from_output(), and nothing else. EngineCore runs the model only through its Executor
(`model_executor`, a UniProcExecutor by default), which loads the model in its workers; EngineCore then
sizes the KV cache by asking the executor (`_initialize_kv_caches`, as vLLM's). `run_engine_core` starts
the child's EngineCore and `run_busy_loop` runs it: take the typed messages that arrived, step while
there is work, send EngineCoreOutputs down the output pipe (a traced engine sends its TraceEvents first).
With async scheduling (`async_scheduling=True`) the busy loop steps through `step_with_batch_queue` instead, as
vLLM's: the executor returns a future for step N, the scheduler (an AsyncScheduler) plans step N+1 at once, and
step N's output is applied when it is ready, from a queue two steps deep. Left out: ZMQ sockets, data parallelism,
pipeline-parallel batch queues deeper than two.
"""
from __future__ import annotations

import gc
import logging
import os
import queue
import signal
import traceback
from collections import deque

from minivllm.attention.selector import get_attn_backend_name
from minivllm.config import CacheConfig, EngineConfig
from minivllm.core.kv_cache_utils import get_kv_cache_config, get_request_block_hasher, max_model_len_for
from minivllm.core.sched.async_scheduler import AsyncScheduler
from minivllm.core.sched.scheduler import Scheduler
from minivllm.engine import (AbortRequests, AddRequests, EngineCoreFailed, EngineCoreOutputs, EngineCoreReady,
                             EngineCoreRequest, Shutdown, TraceEvents, UtilityCall, UtilityOutput)
from minivllm.executor.abstract import Executor
from minivllm.metrics.stats import make_stats
from minivllm.models.loader import load_config, model_class_for
from minivllm.profiler import TorchProfiler
from minivllm.request import Request, RequestStatus
from minivllm.utils.gc_utils import freeze_gc_heap, gc_paused

logger = logging.getLogger("minivllm")


class EngineCore:
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        hf_config = load_config(model_folder)
        self.max_model_len = max_model_len_for(config, hf_config)
        self.block_size = config.block_size
        self.attention_backend = get_attn_backend_name(config.attention_backend, config.device, config.dtype)
        # The executor starts the workers; each loads the model, then the KV cache is sized from what is left.
        self.model_executor = Executor.get_class(config)(config, model_folder)
        self.num_gpu_blocks = self._initialize_kv_caches(config, hf_config)
        scheduler_class = AsyncScheduler if config.async_scheduling else Scheduler
        self.scheduler = scheduler_class(config.scheduler_config(self.max_model_len),
                                   CacheConfig(config.block_size, self.num_gpu_blocks, config.enable_prefix_caching),
                                   num_spec_tokens=config.spec_config.num_speculative_tokens if config.spec_config else 0,
                                   max_verify_tokens=config.spec_max_verify_tokens)
        # prefix caching: each Request hashes its full blocks as its tokens arrive (vLLM's request_block_hasher)
        self.request_block_hasher = get_request_block_hasher(config.block_size) if config.enable_prefix_caching else None
        self.use_spec_decode = config.speculative_config is not None
        # Async scheduling: (future of a step's ModelRunnerOutput, its SchedulerOutput), newest first; two deep
        self.batch_queue: deque | None = deque() if config.async_scheduling else None
        self.batch_queue_size = 2
        self.step_fn = self.step if self.batch_queue is None else self.step_with_batch_queue
        if config.async_scheduling:
            logger.info("Asynchronous scheduling is enabled.")
        self.tracer = None  # set by minivllm.tracing; observes each step, changes nothing
        self.profiler = TorchProfiler(config.profiler_config, f"EngineCore_pid{os.getpid()}") \
            if config.profiler_config else None
        logger.info("EngineCore ready: %s, %d KV blocks of %d tokens, max_model_len=%d, %s attention",
                    model_class_for(hf_config).__name__, self.num_gpu_blocks, config.block_size, self.max_model_len,
                    self.attention_backend)
        freeze_gc_heap()  # what start-up built stays: keep the collector's full passes off it (utils/gc_utils.py)

    def _initialize_kv_caches(self, config: EngineConfig, hf_config) -> int:
        """As vLLM's: ask every worker what memory it has left, size one pool that fits the smallest, allocate it."""
        available_memory = min(self.model_executor.determine_available_memory())
        kv_cache_config = get_kv_cache_config(config, hf_config, available_memory)
        self.model_executor.initialize_from_config(kv_cache_config)
        return kv_cache_config.num_blocks

    def info(self) -> dict:
        return {"max_model_len": self.max_model_len, "num_gpu_blocks": self.num_gpu_blocks,
                "block_size": self.block_size, "attention_backend": self.attention_backend, "pid": os.getpid(),
                "tensor_parallel_size": self.model_executor.config.tensor_parallel_size,
                "max_num_batched_tokens": self.scheduler.scheduler_config.max_num_batched_tokens,  # as resolved
                "async_scheduling": self.batch_queue is not None}

    def add_request(self, request: EngineCoreRequest) -> None:
        self.scheduler.add_request(Request(request.request_id, request.prompt_token_ids, request.sampling_params,
                                           request.eos_token_id, request.priority, request.arrival_time,
                                           block_hasher=self.request_block_hasher))

    def abort_requests(self, request_ids: list[str]) -> None:
        self.scheduler.finish_requests(request_ids, RequestStatus.FINISHED_ABORTED)

    def step(self) -> EngineCoreOutputs:
        """The article's three stages. (Tracing watches from the scheduler's observers, not from here.)"""
        if not self.scheduler.has_unfinished_requests():
            return EngineCoreOutputs()
        scheduler_output = self.scheduler.schedule()  # 1. spend the token and block budgets
        model_output = self.model_executor.execute_model(scheduler_output)  # 2. forward + sample
        return self.scheduler.update_from_output(scheduler_output, model_output)  # 3. append, stop, free

    def step_with_batch_queue(self) -> EngineCoreOutputs:
        """Async scheduling: schedule and launch a step without waiting for the one in flight; apply the oldest
        step's output only when the queue is full or nothing more can be scheduled. Empty outputs: none ready."""
        batch_queue = self.batch_queue
        if self.scheduler.has_unfinished_requests():
            scheduler_output = self.scheduler.schedule()  # 1. plan step N+1 while step N runs
            # 2. launch it (an empty step too: it carries finished_req_ids to the runner)
            batch_queue.appendleft((self.model_executor.execute_model(scheduler_output, non_block=True),
                                    scheduler_output))
            if (scheduler_output.total_num_scheduled_tokens > 0 and len(batch_queue) < self.batch_queue_size
                    and not batch_queue[-1][0].done()):
                return EngineCoreOutputs()  # room for one more: go schedule it before waiting
        if not batch_queue:
            return EngineCoreOutputs()
        future, scheduler_output = batch_queue.pop()  # the oldest step in flight
        return self.scheduler.update_from_output(scheduler_output, future.result())  # 3. append, stop, free

    def has_work(self) -> bool:
        """Requests to schedule, or steps still in flight whose outputs are owed (async scheduling)."""
        return self.scheduler.has_unfinished_requests() or bool(self.batch_queue)

    def post_step(self) -> None:
        """After a step, as vLLM's: with speculative decoding, the drafts the runner proposed go to the scheduler."""
        if self.use_spec_decode and (draft_token_ids := self.model_executor.take_draft_token_ids()) is not None:
            self.scheduler.update_draft_token_ids(draft_token_ids)

    def shutdown(self) -> None:
        """Stop the executor's workers (their processes, under tensor parallelism), and hand start-up's frozen
        objects back to the collector (a dropped engine can then be freed); idempotent."""
        self.model_executor.shutdown()
        gc.unfreeze()

    def get_num_free_blocks(self) -> int:
        return self.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()

    def get_stats(self) -> dict:
        """Counters since the engine started; the prefix-cache ones (tokens) since the last reset_prefix_cache()."""
        return {**make_stats(self.scheduler), "num_gpu_blocks": self.num_gpu_blocks}

    def reset_prefix_cache(self) -> bool:
        """As vLLM's: forget every cached prefix; False (a no-op) while requests are running."""
        return self.scheduler.reset_prefix_cache()

    def profile(self, is_start: bool = True) -> None:
        """vLLM's EngineCore.profile: start or stop the torch profiler (LLM.start_profile / stop_profile)."""
        if self.profiler is None:
            raise RuntimeError("profiler_config was not set when the engine started")
        self.profiler.start() if is_start else self.profiler.stop()

    def enable_tracing(self, session: int | None = None) -> None:
        """Attach a fresh EngineTracer (minivllm.tracing) as an observer of the scheduler; it changes nothing.
        `session` (the live /trace page's) is written into each event, so that a later session skips it."""
        from minivllm.tracing.tracer import EngineTracer
        self.disable_tracing()
        self.tracer = EngineTracer(self.model_executor, session, self.scheduler, len(self.batch_queue or ()))
        self.scheduler.observers.append(self.tracer)

    def disable_tracing(self) -> None:
        """Detach the EngineTracer: the steps run with no observer again (the live /trace page's last viewer left)."""
        from minivllm.tracing.tracer import EngineTracer
        observers = self.scheduler.observers
        observers[:] = [o for o in observers if not isinstance(o, EngineTracer)]
        if self.tracer is not None:
            self.tracer.close()
        self.tracer = None

    def drain_trace(self) -> list:
        """Trace events recorded since the last drain: the busy loop sends them as TraceEvents, ahead of a
        step's outputs; an in-process client (or the last call of a traced run) takes them here."""
        return self.tracer.drain() if self.tracer is not None else []


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
        with gc_paused():  # start-up (utils/gc_utils.py); EngineCore freezes what it built as it ends
            core = EngineCore(config, model_folder)
        send(EngineCoreReady(core.info()))
    except BaseException as e:  # a bad model or config: tell the caller, then exit
        refused = isinstance(e, ValueError)  # bad input: the caller gets the ValueError itself
        send(EngineCoreFailed(str(e) if refused else f"{type(e).__name__}: {e}", refused))
        return
    try:
        run_busy_loop(core, input_queue, send, parent_pid)
    except (BrokenPipeError, EOFError):
        return  # the caller closed its end: nobody is left to serve
    except BaseException:
        send(EngineCoreFailed(traceback.format_exc(), False))
        raise
    finally:
        core.shutdown()


def run_busy_loop(core: EngineCore, input_queue, send, parent_pid: int) -> None:
    """The article's busy loop: block for work when idle, otherwise take every input that has arrived and step."""
    while True:
        idle = not core.has_work()
        try:
            message = input_queue.get(timeout=1.0) if idle else input_queue.get_nowait()
        except queue.Empty:
            message = None
            if os.getppid() != parent_pid:  # the caller is gone: do not outlive it
                return
            if idle:  # a worker process that died while idle ends the engine now (a busy step finds it anyway)
                core.model_executor.check_health()
        while message is not None:
            if isinstance(message, Shutdown):
                return
            _handle_input(core, message, send)
            try:
                message = input_queue.get_nowait()
            except queue.Empty:
                message = None
        if core.has_work():
            outputs = core.step_fn()
            core.post_step()
            if events := core.drain_trace():  # a traced engine: what its observers saw, before the outputs
                send(TraceEvents(events))
            if outputs.outputs:
                send(outputs)


def _handle_input(core: EngineCore, message, send) -> None:
    """One message from the caller, dispatched by its type."""
    if isinstance(message, AddRequests):
        for request in message.requests:
            core.add_request(request)
    elif isinstance(message, AbortRequests):
        core.abort_requests(message.request_ids)
    elif isinstance(message, UtilityCall):
        send(_call_utility(core, message))
    else:
        raise TypeError(f"EngineCore got a message it does not know: {type(message).__name__}")


def _call_utility(core: EngineCore, call: UtilityCall) -> UtilityOutput:
    """Run one EngineCore method for the caller; a failure goes back as its message, the engine lives on."""
    try:
        return UtilityOutput(call.call_id, result=getattr(core, call.method)(*call.args))
    except Exception as e:
        return UtilityOutput(call.call_id, failure_message=f"{type(e).__name__}: {e}")
