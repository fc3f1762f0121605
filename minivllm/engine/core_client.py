"""Mirror of vllm/v1/engine/core_client.py: how LLMEngine talks to EngineCore.

InprocClient holds EngineCore in the caller's process: get_output() runs one step. SyncMPClient
starts EngineCore in a child process: requests go in over an IPC queue, EngineCoreOutputs come back
over a one-way pipe; get_output() only consumes. A dead child is reported within a second, never waited on
forever (even mid-message), a Ctrl-C in the terminal reaches only the caller,
and no child outlives its client. AsyncMPClient (the server's) is SyncMPClient read by one
thread that hands each message to the event loop, so asyncio code awaits outputs and utility
results while EngineCore steps. Every message is a typed dataclass (minivllm/engine/__init__.py),
dispatched by its type. TraceEvents, which only a traced engine sends, are kept apart from the
outputs, in arrival order, until the caller's Trace takes them (`take_trace_events`).
Left out: ZMQ, msgpack, data-parallel clients."""
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
from minivllm.engine import (AbortRequests, AddRequests, EngineCoreFailed, EngineCoreOutputs, EngineCoreRequest,
                             TraceEvents, UtilityCall, UtilityOutput)
from minivllm.engine.core import EngineCore, run_engine_core
from minivllm.engine.exceptions import EngineDeadError, log_traceback
from minivllm.engine.utils import child_setup, stop_process


def make_client(config: EngineConfig, model_folder: str, multiprocess: bool | None = None):
    if multiprocess is None:
        multiprocess = envs.enable_v1_multiprocessing()
    return SyncMPClient(config, model_folder) if multiprocess else InprocClient(config, model_folder)


class InprocClient:
    def __init__(self, config: EngineConfig, model_folder: str) -> None:
        self.engine_core = EngineCore(config, model_folder)
        self.info = self.engine_core.info()
        self._dead: str | None = None
        # a dropped LLM stops its worker processes (tensor parallelism) even without shutdown()
        self._finalizer = weakref.finalize(self, self.engine_core.shutdown)

    def _core(self) -> EngineCore:
        if self._dead:
            raise EngineDeadError(self._dead)
        return self.engine_core

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        for request in requests:
            self._core().add_request(request)

    def get_output(self) -> EngineCoreOutputs:
        try:
            outputs = (core := self._core()).step_fn()  # in-process, consuming output means running a step
            core.post_step()  # speculative decoding: the drafts for the next step
            return outputs
        except EngineDeadError as e:  # a worker process died: every later call says so too
            self._dead = str(e)
            raise

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._core().abort_requests(request_ids)

    def call_utility(self, name: str, *args):
        return getattr(self._core(), name)(*args)

    def take_trace_events(self) -> list:
        """What a traced EngineCore recorded since the last take (in-process: straight from its tracer)."""
        return self._core().drain_trace()

    def shutdown(self) -> None:
        self._dead = self._dead or SHUT_DOWN
        self._finalizer()


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
        self._pending: collections.deque = collections.deque()  # messages that arrived during a utility call
        self.trace_events: list = []  # from TraceEvents messages, up to the last output get_output returned
        self._call_ids = itertools.count()
        self._dead: str | None = None  # why this client can no longer be used
        try:
            self.info = self._receive().info  # EngineCoreReady
        except BaseException:
            self.shutdown()
            raise

    def _died(self) -> EngineDeadError:
        self.process.join(timeout=1)
        self._dead = (f"EngineCore process (pid={self.process.pid}) died unexpectedly with exit code "
                      f"{self.process.exitcode}; its log lines above say why. {self.WHAT_NOW}")
        return EngineDeadError(self._dead)

    def _receive(self):
        """The next message from EngineCore; EngineCoreFailed or a dead child raises here."""
        if self._dead:
            raise EngineDeadError(self._dead)
        while True:
            try:
                if not self.output_conn.poll(self.POLL_S):
                    if not self.process.is_alive():
                        raise self._died()
                    continue
                message = self.output_conn.recv()
            except (EOFError, OSError):
                raise self._died() from None
            if isinstance(message, EngineCoreFailed):
                if message.refused:  # the child rejected bad input rather than failed
                    raise ValueError(message.message)
                self._dead = f"EngineCore failed: {log_traceback('EngineCore', message.message)}"
                raise EngineDeadError(self._dead)
            return message

    def _send(self, message) -> None:
        if self._dead:
            raise EngineDeadError(self._dead)
        if not self.process.is_alive():
            raise self._died()
        self.input_queue.put(message)

    def add_requests(self, requests: list[EngineCoreRequest]) -> None:
        # one message: EngineCore admits the whole batch before its next step
        self._send(AddRequests(list(requests)))

    def abort_requests(self, request_ids: list[str]) -> None:
        if request_ids:
            self._send(AbortRequests(list(request_ids)))

    def get_output(self) -> EngineCoreOutputs:
        while True:
            message = self._pending.popleft() if self._pending else self._receive()
            if isinstance(message, TraceEvents):  # kept in arrival order, for the caller's Trace
                self.trace_events.extend(message.events)
            elif isinstance(message, EngineCoreOutputs):
                return message

    def take_trace_events(self) -> list:
        """TraceEvents received up to the last output get_output() returned (tracing's own channel)."""
        events, self.trace_events = self.trace_events, []
        return events

    def call_utility(self, name: str, *args):
        call_id = next(self._call_ids)
        self._send(UtilityCall(call_id, name, args))
        while True:
            message = self._receive()
            if isinstance(message, UtilityOutput) and message.call_id == call_id:
                if message.failure_message is not None:
                    raise RuntimeError(f"EngineCore.{name} failed (the engine is still running): "
                                       f"{message.failure_message}")
                return message.result
            if isinstance(message, (EngineCoreOutputs, TraceEvents)):
                self._pending.append(message)  # get_output takes them later, in order

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
                message = self._receive()
            except Exception as e:  # EngineDeadError, or the child's EngineCoreFailed: either way it is gone
                self._dead = self._dead or str(e)
                self._post(self._fail_all, e if isinstance(e, EngineDeadError) else EngineDeadError(str(e)))
                return
            self._post(self._resolve if isinstance(message, UtilityOutput) else self._outputs.put_nowait, message)

    def _post(self, fn, arg) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: the server is gone
            self._loop.call_soon_threadsafe(fn, arg)

    def _resolve(self, reply: UtilityOutput) -> None:
        future = self._utility_futures.pop(reply.call_id, None)
        if future is not None and not future.done():
            if reply.failure_message is not None:
                future.set_exception(RuntimeError(reply.failure_message))
            else:
                future.set_result(reply.result)

    def _fail_all(self, error: EngineDeadError) -> None:
        self._outputs.put_nowait(error)
        for future in self._utility_futures.values():
            if not future.done():
                future.set_exception(error)
        self._utility_futures.clear()

    async def get_output_async(self) -> EngineCoreOutputs:
        self._start_reader()
        while True:
            item = await self._outputs.get()
            if isinstance(item, BaseException):
                self._outputs.put_nowait(item)  # every later call sees it too
                raise item
            if isinstance(item, TraceEvents):
                self.trace_events.extend(item.events)
            else:
                return item

    async def call_utility_async(self, name: str, *args):
        self._start_reader()
        call_id, future = next(self._call_ids), self._loop.create_future()
        self._utility_futures[call_id] = future
        self._send(UtilityCall(call_id, name, args))
        return await future

    def call_utility(self, name: str, *args):
        raise RuntimeError(f"AsyncMPClient.call_utility({name!r}): the reader thread owns the pipe; await "
                           f"call_utility_async instead.")
