"""Mirror of vllm/v1/executor/uniproc_executor.py: UniProcExecutor, one Worker in EngineCore's own process.

The default when tensor_parallel_size is 1: `collective_rpc` is a plain method call on the one
worker (the driver), so a step costs no copy and no message. Left out: vLLM's
ExecutorWithExternalLauncher (torchrun) and WorkerWrapperBase (the worker is held directly).
"""
from __future__ import annotations

from typing import Any, Callable

from minivllm.executor.abstract import Executor
from minivllm.worker.gpu_worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        self.driver_worker = Worker(self.config, self.model_folder, local_rank=0, rank=0, is_driver_worker=True)
        self.driver_worker.init_device()
        self.driver_worker.load_model()

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
                       unique_reply_rank: int | None = None, timeout: float | None = None) -> list[Any]:
        # one worker, in this thread: its answer is every rank's, and a call cannot be abandoned midway
        call = getattr(self.driver_worker, method) if isinstance(method, str) \
            else (lambda *a, **k: method(self.driver_worker, *a, **k))
        return [call(*args, **(kwargs or {}))]

    def shutdown(self) -> None:
        if self.driver_worker is not None:
            self.driver_worker.shutdown()
            self.driver_worker = None
