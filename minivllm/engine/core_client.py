"""Mirror of vllm/v1/engine/core_client.py: how LLMEngine talks to EngineCore.

InprocClient holds EngineCore in the caller's process: get_output() runs one
step. SyncMPClient starts EngineCore in a child process and talks over two
IPC queues: requests in, EngineCoreOutputs out; get_output() only consumes.
A dead child is reported within a second, never waited on forever, and no
child outlives its client. Left out: ZMQ, msgpack, async clients, data-parallel clients.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import multiprocessing
import os
import queue
import sys
import weakref

from minivllm.config import EngineConfig
from minivllm.engine import EngineCoreOutputs, EngineCoreRequest
from minivllm.engine.core import EngineCore, run_engine_core


class EngineDeadError(RuntimeError):
    """The EngineCore process died; the engine cannot continue."""


def make_client(config: EngineConfig, model_folder: str, multiprocess: bool | None = None):
    if multiprocess is None:
        multiprocess = os.environ.get("MINIVLLM_ENABLE_V1_MULTIPROCESSING", "1") != "0"
    return SyncMPClient(config, model_folder) if multiprocess else InprocClient(config, model_folder)


class InprocClient:
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        self.engine_core = EngineCore(config, model_folder)
        self.info = self.engine_core.info()

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        for request in requests:
            self.engine_core.add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        return self.engine_core.step()  # in-process, consuming output means running a step

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.engine_core.abort_requests(request_ids)

    def call_utility(self, name: str, *args):
        return getattr(self.engine_core, name)(*args)

    def shutdown(self) -> None:
        pass


def _stop_process(process, input_queue) -> None:
    if process.is_alive():
        try:
            input_queue.put(("SHUTDOWN", None))
        except (OSError, ValueError):
            pass
        process.join(timeout=3)
    if process.is_alive():
        process.kill()
        process.join(timeout=3)


@contextlib.contextmanager
def _main_module_hidden():
    """Start the child without re-running the caller's script.

    A spawned child normally re-imports the caller's __main__ (which is why scripts need an
    `if __name__ == "__main__":` guard). EngineCore needs nothing from it, so while the child is
    being started we hide where __main__ came from, and a plain script just works.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    try:
        for key in saved:
            setattr(main, key, None) if key == "__spec__" else delattr(main, key)
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)


class SyncMPClient:
    POLL_S = 0.2

    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked thread pools
        self.input_queue, self.output_queue = ctx.Queue(), ctx.Queue()
        self.process = ctx.Process(target=run_engine_core, name="EngineCore", daemon=True,
                                   args=(config, str(model_folder), self.input_queue, self.output_queue, os.getpid()))
        with _main_module_hidden():
            self.process.start()
        self._finalizer = weakref.finalize(self, _stop_process, self.process, self.input_queue)
        self._pending: collections.deque = collections.deque()  # outputs that arrived during a utility call
        self._call_ids = itertools.count()
        try:
            _, self.info = self._receive()  # ("READY", info)
        except BaseException:
            self.shutdown()
            raise

    def _receive(self) -> tuple[str, object]:
        """The next (kind, payload) from EngineCore; an ERROR message or a dead child raises here."""
        while True:
            try:
                kind, payload, *rest = self.output_queue.get(timeout=self.POLL_S)
            except queue.Empty:
                if not self.process.is_alive():
                    raise EngineDeadError(
                        f"EngineCore process (pid={self.process.pid}) died unexpectedly with exit code "
                        f"{self.process.exitcode}; its log lines above say why. Create a new LLM to continue.")
                continue
            if kind == "ERROR":  # rest[0]: the child refused bad input (a ValueError) rather than failed
                raise ValueError(payload) if rest and rest[0] else EngineDeadError(f"EngineCore failed:\n{payload}")
            return kind, payload

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        # one message: EngineCore admits the whole batch before its next step
        self.input_queue.put(("ADD", list(requests)))

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self.input_queue.put(("ABORT", list(request_ids)))

    def get_output(self) -> EngineCoreOutputs:
        if self._pending:
            return self._pending.popleft()
        while True:
            kind, payload = self._receive()
            if kind == "OUTPUTS":
                return payload

    def call_utility(self, name: str, *args):
        call_id = next(self._call_ids)
        self.input_queue.put(("UTILITY", (call_id, name, args)))
        while True:
            kind, payload = self._receive()
            if kind == "UTILITY" and payload[0] == call_id:
                return payload[1]
            if kind == "OUTPUTS":
                self._pending.append(payload)

    def shutdown(self) -> None:
        self._finalizer()
