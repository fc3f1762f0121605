"""Mirror of vllm/v1/engine/core_client.py: how LLMEngine talks to EngineCore.

InprocClient holds EngineCore in the caller's process: get_output() runs one
step. SyncMPClient starts EngineCore in a child process: requests go in over
an IPC queue, EngineCoreOutputs come back over a one-way pipe; get_output()
only consumes. A dead child is reported within a second, never waited on
forever (even mid-message), a Ctrl-C in the terminal reaches only the caller,
and no child outlives its client. AsyncMPClient (the server's) is SyncMPClient read by one
thread that hands each message to the event loop, so asyncio code awaits outputs and utility
results while EngineCore steps. Left out: ZMQ, msgpack, data-parallel clients.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import multiprocessing
import os
import threading
import weakref

from minivllm import envs
from minivllm.config import EngineConfig
from minivllm.engine import EngineCoreOutputs, EngineCoreOutputType, EngineCoreRequest, EngineCoreRequestType
from minivllm.engine.core import EngineCore, run_engine_core
from minivllm.engine.utils import child_setup, stop_process


class EngineDeadError(RuntimeError):
    """The EngineCore process died; the engine cannot continue."""


def make_client(config: EngineConfig, model_folder: str, multiprocess: bool | None = None):
    if multiprocess is None:
        multiprocess = envs.enable_v1_multiprocessing()
    return SyncMPClient(config, model_folder) if multiprocess else InprocClient(config, model_folder)


class InprocClient:
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        self.engine_core = EngineCore(config, model_folder)
        self.info = self.engine_core.info()
        self._shut_down = False

    def _core(self) -> EngineCore:
        if self._shut_down:
            raise EngineDeadError(SHUT_DOWN)
        return self.engine_core

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        for request in requests:
            self._core().add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        return self._core().step()  # in-process, consuming output means running a step

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._core().abort_requests(request_ids)

    def call_utility(self, name: str, *args):
        return getattr(self._core(), name)(*args)

    def shutdown(self) -> None:
        self._shut_down = True


SHUT_DOWN = "The engine was shut down (LLM.shutdown()): create a new LLM to continue."


class SyncMPClient:
    POLL_S = 0.2
    WHAT_NOW = "Create a new LLM to continue."  # the last words of a dead-child error

    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked thread pools
        self.input_queue = ctx.Queue()
        # Never block this process's exit on a feeder thread writing to a child that no longer reads.
        self.input_queue.cancel_join_thread()
        # Outputs come back over a one-way pipe whose write end only the child holds: when the child
        # dies, even in the middle of a message, the read here ends with EOF instead of waiting forever.
        self.output_conn, writer = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=run_engine_core, name="EngineCore", daemon=True,
                                   args=(config, str(model_folder), self.input_queue, writer, os.getpid()))
        with child_setup(), envs.engine_core_child_environment():
            self.process.start()
        writer.close()
        self._finalizer = weakref.finalize(self, stop_process, self.process, self.input_queue)
        self._pending: collections.deque = collections.deque()  # outputs that arrived during a utility call
        self._call_ids = itertools.count()
        self._dead: str | None = None  # why this client can no longer be used
        try:
            _, self.info = self._receive()  # (READY, info)
        except BaseException:
            self.shutdown()
            raise

    def _died(self) -> EngineDeadError:
        self.process.join(timeout=1)
        self._dead = (f"EngineCore process (pid={self.process.pid}) died unexpectedly with exit code "
                      f"{self.process.exitcode}; its log lines above say why. {self.WHAT_NOW}")
        return EngineDeadError(self._dead)

    def _receive(self) -> tuple[EngineCoreOutputType, object]:
        """The next (type, payload) from EngineCore; an ERROR message or a dead child raises here."""
        if self._dead:
            raise EngineDeadError(self._dead)
        while True:
            try:
                if not self.output_conn.poll(self.POLL_S):
                    if not self.process.is_alive():
                        raise self._died()
                    continue
                kind, payload = self.output_conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if kind == EngineCoreOutputType.ERROR:
                message, refused = payload  # refused: the child rejected bad input rather than failed
                if refused:
                    raise ValueError(message)
                self._dead = f"EngineCore failed:\n{message}"
                raise EngineDeadError(self._dead)
            return kind, payload

    def _send(self, kind: EngineCoreRequestType, payload) -> None:
        if self._dead:
            raise EngineDeadError(self._dead)
        if not self.process.is_alive():
            raise self._died()
        self.input_queue.put((kind, payload))

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        # one message: EngineCore admits the whole batch before its next step
        self._send(EngineCoreRequestType.ADD, list(requests))

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._send(EngineCoreRequestType.ABORT, list(request_ids))

    def get_output(self) -> EngineCoreOutputs:
        if self._pending:
            return self._pending.popleft()
        while True:
            kind, payload = self._receive()
            if kind == EngineCoreOutputType.OUTPUTS:
                return payload

    def call_utility(self, name: str, *args):
        call_id = next(self._call_ids)
        self._send(EngineCoreRequestType.UTILITY, (call_id, name, args))
        while True:
            kind, payload = self._receive()
            if kind == EngineCoreOutputType.UTILITY and payload[0] == call_id:
                _, error, result = payload
                if error is not None:
                    raise RuntimeError(f"EngineCore.{name} failed (the engine is still running): {error}")
                return result
            if kind == EngineCoreOutputType.OUTPUTS:
                self._pending.append(payload)

    def shutdown(self) -> None:
        self._dead = self._dead or SHUT_DOWN
        self._finalizer()


class AsyncMPClient(SyncMPClient):
    """vLLM's AsyncMPClient: the same child, awaited. One reader thread owns the output pipe.

    vLLM reads its ZMQ socket in an asyncio task; a multiprocessing pipe has no async read, so a
    thread blocks on it instead and passes each message to the loop with call_soon_threadsafe:
    OUTPUTS go to a queue that `get_output_async` awaits, a UTILITY reply resolves its future, and
    a dead child (or ERROR) is put on the queue as the EngineDeadError, so no awaiter waits forever.
    """
    WHAT_NOW = "Restart the server to continue."
    _loop = None

    def _start_reader(self) -> None:
        if self._loop is None:  # on first use, from the event loop that will await outputs
            self._loop, self._outputs, self._utility_futures = asyncio.get_running_loop(), asyncio.Queue(), {}
            threading.Thread(target=self._read_outputs, name="EngineCoreOutputReader", daemon=True).start()

    def _read_outputs(self) -> None:
        while True:
            try:
                kind, payload = self._receive()
            except Exception as e:  # EngineDeadError, or the child's ERROR: either way it is gone
                self._dead = self._dead or str(e)
                self._post(self._fail_all, e if isinstance(e, EngineDeadError) else EngineDeadError(str(e)))
                return
            self._post(self._outputs.put_nowait if kind == EngineCoreOutputType.OUTPUTS else self._resolve, payload)

    def _post(self, fn, arg) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            self._loop.call_soon_threadsafe(fn, arg)

    def _resolve(self, payload: tuple) -> None:  # a UTILITY reply: (call_id, error, result)
        future = self._utility_futures.pop(payload[0], None)
        if future is not None and not future.done():
            future.set_exception(RuntimeError(payload[1])) if payload[1] is not None else future.set_result(payload[2])

    def _fail_all(self, error: EngineDeadError) -> None:
        self._outputs.put_nowait(error)
        for future in self._utility_futures.values():
            if not future.done():
                future.set_exception(error)
        self._utility_futures.clear()

    async def get_output_async(self) -> EngineCoreOutputs:
        self._start_reader()
        item = await self._outputs.get()
        if isinstance(item, BaseException):
            self._outputs.put_nowait(item)  # every later call sees it too
            raise item
        return item

    async def call_utility_async(self, name: str, *args):
        self._start_reader()
        call_id, future = next(self._call_ids), self._loop.create_future()
        self._utility_futures[call_id] = future
        self._send(EngineCoreRequestType.UTILITY, (call_id, name, args))
        return await future

    def call_utility(self, name: str, *args):
        raise RuntimeError(f"AsyncMPClient.call_utility({name!r}): the reader thread owns the pipe; await "
                           f"call_utility_async instead.")
