"""Mirror of vllm/v1/executor/abstract.py: Executor, the one object EngineCore runs the model through.

EngineCore never touches a worker: it asks its Executor. Every call fans out to all workers with
`collective_rpc(method, args, kwargs)` (a Worker method name, or a function called with the worker
as its first argument, as vLLM's) and comes back as one result per rank. `execute_model` keeps the
driver rank's output only; `determine_available_memory` returns every rank's answer, and EngineCore
sizes the pool by the smallest. A subclass says where the workers live: `UniProcExecutor` holds one
Worker in EngineCore's process; `MultiprocExecutor` one process per tensor-parallel rank, with the
same calls. Left out: Ray, pipeline parallelism, non-blocking futures, KV connectors, sleep/wake, LoRA.
"""
from __future__ import annotations

import importlib
from typing import Any, Callable

from minivllm.config import EngineConfig
from minivllm.core.kv_cache_utils import KVCacheConfig
from minivllm.core.sched.output import SchedulerOutput
from minivllm.outputs import ModelRunnerOutput

# distributed_executor_backend -> the class that runs it (by name: the subclasses import this module)
EXECUTOR_BACKENDS = {"uni": "minivllm.executor.uniproc_executor.UniProcExecutor",
                     "mp": "minivllm.executor.multiproc_executor.MultiprocExecutor"}


class Executor:
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
                       unique_reply_rank: int | None = None, timeout: float | None = None) -> list[Any]:
        """Run `method` on every worker; one result per rank, rank 0 first (with `unique_reply_rank`, only
        that rank's, in a list of one). `timeout`: seconds to wait for the answer, None for no limit."""
        raise NotImplementedError

    def determine_available_memory(self) -> list[int]:
        """Bytes each worker can give its KV cache, one per rank."""
        return self.collective_rpc("determine_available_memory")

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Every worker allocates the same pool, then captures its CPU graphs (vLLM: its CUDA graphs)."""
        self.collective_rpc("initialize_from_config", args=(kv_cache_config,))
        self.collective_rpc("compile_or_warm_up_model")

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        """One step on every worker; the driver rank's output is the step's."""
        return self.collective_rpc("execute_model", args=(scheduler_output,))[0]

    def take_draft_token_ids(self):
        """Speculative decoding: the drafts the driver rank proposed in the last step (a DraftTokenIds or None)."""
        return self.collective_rpc("take_draft_token_ids", unique_reply_rank=0)[0]

    def check_health(self) -> None:
        """Raise if a worker is gone."""
        self.collective_rpc("check_health")

    def shutdown(self) -> None:
        raise NotImplementedError
