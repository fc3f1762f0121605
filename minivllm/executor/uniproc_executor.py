"""Mirror of vllm/v1/executor/uniproc_executor.py: UniProcExecutor, one Worker in EngineCore's own process.

The default when tensor_parallel_size is 1: `collective_rpc` is a plain method call on the one
worker (the driver), so a step costs no copy and no message. A non-blocking call (async scheduling's
execute_model) runs on the executor's one step thread instead, so EngineCore schedules the next step while the
forward runs (the forward's C and torch code releases the GIL; on a GPU vLLM overlaps a device-to-host copy the
same way); a blocking call first waits for the calls in flight, so the worker sees every call in order. Left
out: vLLM's ExecutorWithExternalLauncher (torchrun) and WorkerWrapperBase (the worker is held directly).
"""
from __future__ import annotations

import concurrent.futures
from typing import Any, Callable

import torch

from minivllm.executor.abstract import Executor
from minivllm.worker.gpu_worker import Worker


class UniProcExecutor(Executor):
    def _init_executor(self) -> None:
        self.driver_worker = Worker(self.config, self.model_folder, local_rank=0, rank=0, is_driver_worker=True)
        self.driver_worker.init_device()
        self.driver_worker.load_model()
        self._step_thread: concurrent.futures.ThreadPoolExecutor | None = None
        self._in_flight: list[concurrent.futures.Future] = []

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
                       unique_reply_rank: int | None = None, timeout: float | None = None,
                       non_block: bool = False):
        # one worker: its answer is every rank's, and a call cannot be abandoned midway
        call = getattr(self.driver_worker, method) if isinstance(method, str) \
            else (lambda *a, **k: method(self.driver_worker, *a, **k))
        if non_block:
            future = self._thread().submit(lambda: [call(*args, **(kwargs or {}))])
            self._in_flight = [f for f in self._in_flight if not f.done()] + [future]
            return future
        concurrent.futures.wait(self._in_flight)  # in order: the steps in flight first
        self._in_flight = []
        return [call(*args, **(kwargs or {}))]

    def check_health(self) -> None:
        return  # the one worker lives in this process: while this runs, it is alive (and a step in flight is not waited for)

    def _thread(self) -> concurrent.futures.ThreadPoolExecutor:
        """One thread, so steps run one after the other; it runs torch with this thread's thread count."""
        if self._step_thread is None:
            self._step_thread = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="minivllm-step", initializer=torch.set_num_threads,
                initargs=(torch.get_num_threads(),))
        return self._step_thread

    def shutdown(self) -> None:
        if getattr(self, "_step_thread", None) is not None:
            self._step_thread.shutdown(wait=True)  # the step in flight ends before the worker goes
            self._step_thread = None
        if self.driver_worker is not None:
            self.driver_worker.shutdown()
            self.driver_worker = None
