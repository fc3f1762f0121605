"""Mirror of vllm/v1/executor/abstract.py: Executor, the one object EngineCore runs the model through.

EngineCore never touches a worker: it asks its Executor. Every call fans out to all workers with
`collective_rpc(method, args, kwargs)` (a Worker method name, or a function called with the worker
as its first argument, as vLLM's) and comes back as one result per rank. `execute_model` keeps the
driver rank's output only; `determine_available_memory` returns every rank's answer, and EngineCore
sizes the pool by the smallest. A subclass says where the workers live: `UniProcExecutor` holds one
Worker in EngineCore's process; `MultiprocExecutor` one process per tensor-parallel rank, with the
same calls. With async scheduling EngineCore asks for `execute_model(..., non_block=True)` and gets a future
(`done()`, `result()`) at once: UniProcExecutor runs the step on a thread of its own, MultiprocExecutor sends the
call to the ranks and reads the reply when the result is asked for; either way calls reach the workers, and
their replies come back, in the order they were made. Left out: Ray, pipeline parallelism, KV connectors,
sleep/wake, LoRA.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from minivllm.config import EngineConfig
from minivllm.core.kv_cache_utils import KVCacheConfig
from minivllm.core.sched.output import SchedulerOutput

# distributed_executor_backend -> the class that runs it (by name: the subclasses import this module)
EXECUTOR_BACKENDS = {"uni": "minivllm.executor.uniproc_executor.UniProcExecutor",
                     "mp": "minivllm.executor.multiproc_executor.MultiprocExecutor"}


class FutureWrapper:
    """A future whose result is `fn` of another future's (vLLM's FutureWrapper): the driver rank's output out of
    every rank's, say."""

    def __init__(self, inner, fn: Callable[[Any], Any]) -> None:
        self.inner, self.fn = inner, fn

    def done(self) -> bool:
        return self.inner.done()

    def result(self) -> Any:
        return self.fn(self.inner.result())


class Executor:
    execute_model_timeout: float | None = None  # seconds a step may take before the engine is declared dead
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        self.config, self.model_folder = config, model_folder
        self.is_failed = False
        self._init_executor()

    @staticmethod
    def get_class(config: EngineConfig) -> type["Executor"]:
        """The Executor subclass for this config, by its qualified name, as vLLM resolves a
        distributed_executor_backend ("uni": one worker in this process; "mp": one process per rank)."""
        module, _, name = EXECUTOR_BACKENDS[config.distributed_executor_backend].rpartition(".")
        return getattr(importlib.import_module(module), name)

    def _init_executor(self) -> None:
        """Start the workers and bring each to a loaded model (init_device, load_model)."""
        raise NotImplementedError

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
                       unique_reply_rank: int | None = None, timeout: float | None = None,
                       non_block: bool = False) -> list[Any]:
        """Run `method` on every worker; one result per rank, rank 0 first (with `unique_reply_rank`, only
        that rank's, in a list of one). `timeout`: seconds to wait for the answer, None for no limit.
        `non_block`: return a future of that list at once; a later blocking call waits for it first."""
        raise NotImplementedError

    def determine_available_memory(self) -> list[int]:
        """Bytes each worker can give its KV cache, one per rank."""
        return self.collective_rpc("determine_available_memory")

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Every worker allocates the same pool, then captures its CPU graphs (vLLM: its CUDA graphs)."""
        self.collective_rpc("initialize_from_config", args=(kv_cache_config,))
        self.collective_rpc("compile_or_warm_up_model")

    def execute_model(self, scheduler_output: SchedulerOutput, non_block: bool = False):
        """One step on every worker; the driver rank's output is the step's (with non_block, a future of it)."""
        output = self.collective_rpc("execute_model", args=(scheduler_output,), unique_reply_rank=0,
                                     timeout=self.execute_model_timeout, non_block=non_block)
        return FutureWrapper(output, lambda replies: replies[0]) if non_block else output[0]

    def take_draft_token_ids(self):
        """Speculative decoding: the drafts the driver rank proposed in the last step (a DraftTokenIds or None)."""
        return self.collective_rpc("take_draft_token_ids", unique_reply_rank=0)[0]

    def check_health(self) -> None:
        """Raise if a worker is gone."""
        self.collective_rpc("check_health")

    def shutdown(self) -> None:
        raise NotImplementedError
