"""What `minivllm serve` lets one client learn about another's requests: the live trace page (off by default,
redacted unless asked), viewers that leave switching tracing off, and errors that carry no traceback.

Servers run on a thread of this process over the tiny random Llama (SmolLM2's tokenizer and chat template),
bound to 127.0.0.1; every wait is a handshake or a bounded poll.
"""
from __future__ import annotations

import json
import logging
import re
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.error
import urllib.request

import pytest

PASSPHRASE = "zebra quartz lantern 7731 marmalade"
SECRET_REQUEST_ID = "alice-private-id-4242"


def _server(folder, **app_kwargs):
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    return ServerThread(AsyncLLM.from_engine_args(EngineArgs(model=str(folder), max_model_len=256)), **app_kwargs)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post(url: str, body: dict, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json",
                                                                      **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class RawEvents:
    """/trace/events read raw on a thread: every byte the server sent, and a wake-up per SSE message."""

    def __init__(self, base: str) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.sock = socket.create_connection((host, int(port)), timeout=120)
        self.sock.sendall(b"GET /trace/events HTTP/1.0\r\n\r\n")  # 1.0: the body as sent, not in chunks
        self.raw, self.cond = b"", threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = self.sock.recv(1 << 16)
            except OSError:
                return
            if not chunk:
                return
            with self.cond:
                self.raw += chunk
                self.cond.notify_all()

    def events(self) -> list[dict]:
        return [e for line in self.raw.split(b"\n")[:-1] if line.startswith(b"data: ")  # whole lines only
                for e in json.loads(line[6:])["events"]]

    def wait_for(self, predicate, timeout: float = 120) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), timeout), "the event stream did not get there"

    def close(self) -> None:
        self.sock.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=30)
        self.sock.close()


def _int_lists(value):
    """Every list of ints inside a JSON value."""
    if isinstance(value, dict):
        for v in value.values():
            yield from _int_lists(v)
    elif isinstance(value, list):
        if value and all(isinstance(v, int) for v in value):
            yield value
        for v in value:
            yield from _int_lists(v)


def _contains_run(haystack: list[int], needle: list[int]) -> bool:
    return any(haystack[i:i + len(needle)] == needle for i in range(len(haystack) - len(needle) + 1))


def _secret_chat_leaks(folder, **app_kwargs) -> dict[str, bool]:
    """A page open while a client chats with a passphrase (whole and streamed): what of it reached the page."""
    server = _server(folder, enable_trace_page=True, **app_kwargs)
    base = server.url.removesuffix("/v1")
    try:
        reader = RawEvents(base)
        reader.wait_for(lambda r: b"data: " in r.raw)  # connected: tracing is on
        outputs = []
        for stream in (False, True):
            body = {"model": server.engine.served_model_name, "max_tokens": 8, "temperature": 0, "stream": stream,
                    "ignore_eos": True, "messages": [{"role": "user", "content": f"My passphrase is {PASSPHRASE}."}]}
            status, text = _post(server.url + "/chat/completions", body,
                                 {"X-Request-Id": f"{SECRET_REQUEST_ID}-{stream}"})
            assert status == 200, text
            outputs.append(text)
        reader.wait_for(lambda r: sum(e["kind"] == "update" and any(o["finish_reason"] for o in e["outputs"])
                                      for e in r.events()) >= 2)
        status, html = _get(base + "/trace")
        assert status == 200
        reader.close()
    finally:
        server.stop()
    whole = json.loads(outputs[0])["choices"][0]["message"]["content"]
    tokenizer = server.engine.tokenizer
    secret_ids = tokenizer.encode(" " + PASSPHRASE, add_special_tokens=False)[1:-1]  # the words inside
    lists = [ids for e in reader.events() for ids in _int_lists(e)]
    return {"passphrase": any(PASSPHRASE.encode() in raw or b"quartz lantern" in raw for raw in (reader.raw, html)),
            "request id": any(SECRET_REQUEST_ID.encode() in raw for raw in (reader.raw, html)),
            "token ids": any(_contains_run(ids, secret_ids) for ids in lists),
            "generated text": len(whole) >= 6 and json.dumps(whole)[1:-1].encode() in reader.raw}


@pytest.mark.timeout(300)
def test_trace_page_is_off_by_default_and_404s_as_an_unknown_route(tiny_llama_folder):
    server = _server(tiny_llama_folder)
    base = server.url.removesuffix("/v1")
    try:
        unknown = _get(base + "/no-such-page")
        assert unknown[0] == 404
        for path in ("/trace", "/trace/events"):
            assert _get(base + path) == unknown[:1] + (unknown[1].replace(b"/no-such-page", path.encode()),)
        assert server.app.state.live_trace is None and server.engine.tracer is None
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_page_on_shows_no_request_text_token_ids_or_request_ids(tiny_llama_folder):
    leaks = _secret_chat_leaks(tiny_llama_folder)
    assert not any(leaks.values()), leaks


@pytest.mark.timeout(300)
def test_page_with_show_requests_shows_them(tiny_llama_folder):
    """The control for the test above: the same checks find the passphrase when the second flag asks for it."""
    leaks = _secret_chat_leaks(tiny_llama_folder, trace_page_show_requests=True)
    assert leaks["passphrase"] and leaks["request id"] and leaks["token ids"], leaks


def test_show_requests_alone_is_refused_naming_the_fix():
    from minivllm.entrypoints.openai.api_server import build_app
    with pytest.raises(ValueError, match="add --enable-trace-page"):
        build_app(None, trace_page_show_requests=True)
    out = subprocess.run([sys.executable, "-m", "minivllm", "serve", "--trace-page-show-requests"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "add --enable-trace-page" in out.stderr, out.stderr[-2000:]


def test_help_says_what_the_page_exposes():
    out = subprocess.run([sys.executable, "-m", "minivllm", "serve", "--help"], capture_output=True, text=True,
                         timeout=60)
    text = " ".join(out.stdout.split())
    assert "--enable-trace-page serve minivllm's live trace viewer at GET /trace" in text
    for words in ("off: both are 404", "block ids", "aliases", "Request text and token ids are left out",
                  "--trace-page-show-requests with --enable-trace-page: the page also shows every request's text"):
        assert words in text, words


class LogRecords(logging.Handler):
    """The "minivllm" logger's records while in use (its own handler: init_logger stops propagation to caplog's)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> str:
        return "\n".join(self.format(r) for r in self.records)

    def __enter__(self) -> "LogRecords":
        logger = logging.getLogger("minivllm")
        self.level, self.formatter = logger.level, logging.Formatter("%(message)s")
        logger.setLevel(logging.INFO)
        logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        logging.getLogger("minivllm").removeHandler(self)
        logging.getLogger("minivllm").setLevel(self.level)


def test_start_up_log_line_and_a_warning_off_loopback(monkeypatch):
    """announce_trace_page's lines, read from a logger of the test's own (the shared "minivllm" logger's level and
    handlers are whatever earlier tests left)."""
    from minivllm.entrypoints.openai import trace_page
    logs = LogRecords()
    logger = logging.Logger("trace-page-under-test", logging.INFO)
    logger.addHandler(logs)
    monkeypatch.setattr(trace_page, "logger", logger)
    trace_page.announce_trace_page("127.0.0.1", False)
    assert [r.levelno for r in logs.records] == [logging.INFO]
    assert "block ids" in logs.text() and "no request text or token ids" in logs.text()
    logs.records.clear()
    trace_page.announce_trace_page("0.0.0.0", True)
    assert [r.levelno for r in logs.records] == [logging.INFO, logging.WARNING]
    assert "not a loopback address" in logs.text() and "prompts and outputs" in logs.text()


@pytest.mark.timeout(300)
def test_server_errors_tell_clients_one_line_and_log_the_traceback(tiny_llama_folder):
    """EngineCore fails mid-stream (a message its busy loop does not know raises TypeError there): the stream's
    error event, later requests' 500s and /health's 503 each carry one line, no traceback and no source path;
    the traceback is in the server's log."""
    server = _server(tiny_llama_folder)
    body = {"model": server.engine.served_model_name, "prompt": "Once upon a time", "max_tokens": 200,
            "ignore_eos": True, "stream": True}
    request = urllib.request.Request(server.url + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    try:
        with LogRecords() as logs, urllib.request.urlopen(request, timeout=120) as stream:
            first = stream.readline()
            assert first.startswith(b"data: {"), first  # mid-generation: 199 tokens to go
            server.engine.engine_core._send("not a message EngineCore knows")
            events = [first] + [line for line in stream.read().split(b"\n") if line.startswith(b"data: ")]
            deadline = time.monotonic() + 30
            while not any("Traceback" in m for m in logs.text().splitlines()):
                assert time.monotonic() < deadline, "the server's log has no traceback of the failure"
                time.sleep(0.05)
        errors = [json.loads(e[6:])["error"] for e in events if b'"error"' in e]
        assert len(errors) == 1 and events[-1] == b"data: [DONE]", events[-3:]
        bodies = [json.dumps(errors[0]).encode()]
        for stream_flag in (False, True):
            status, text = _post(server.url + "/completions", {**body, "stream": stream_flag, "max_tokens": 2})
            assert status == 500, text
            bodies.append(text)
        status, text = _get(server.url.removesuffix("/v1") + "/health")
        assert status == 503
        bodies.append(text)
        for raw in bodies:
            message = json.loads(raw)["message" if b'"message"' in raw[:12] else "error"]
            message = message["message"] if isinstance(message, dict) else message
            assert "Traceback" not in message and not re.search(r"\.py\b", message) and "\n" not in message, message
            assert "TypeError: EngineCore got a message it does not know" in message, message
    finally:
        server.stop()


@pytest.mark.timeout(300)
def test_viewers_that_leave_switch_tracing_off(tiny_llama_folder):
    """Five pages that leave after their first message, then five that leave as soon as they asked (the server
    is still switching tracing on for them): then requests run with no tracing in EngineCore, no events kept."""
    server = _server(tiny_llama_folder, enable_trace_page=True)
    hub, core = server.app.state.live_trace, server.engine.engine_core
    base = server.url.removesuffix("/v1")
    host, port = base.removeprefix("http://").split(":")
    ended, cond, stream = [0], threading.Condition(), hub.stream

    async def counted():  # each /trace/events stream, counted once its generator is done
        try:
            async for chunk in stream():
                yield chunk
        finally:
            with cond:
                ended[0] += 1
                cond.notify_all()

    hub.stream = counted
    taken, take = [], core.take_trace_events

    def spy(self) -> list:  # what the server takes from EngineCore's TraceEvents with no page to give them to
        events = take()
        taken.extend(events)
        return events

    core.take_trace_events = types.MethodType(spy, core)  # a bound method: a LiveTrace holds it weakly

    def viewer(until: bytes) -> None:
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            sock.sendall(b"GET /trace/events HTTP/1.1\r\nHost: test\r\n\r\n")
            got = b""
            while until not in got:
                chunk = sock.recv(1 << 16)
                assert chunk, "the server closed the stream"
                got += chunk

    try:
        for until in [b"data: "] * 5 + [b""] * 5:  # b"": closed as soon as the request is sent
            viewer(until)
        with cond:
            assert cond.wait_for(lambda: ended[0] == 10, 60), f"{ended[0]} of 10 streams ended"
        deadline = time.monotonic() + 30
        while hub.viewers or hub.lock.locked():
            assert time.monotonic() < deadline, "the last viewer's detach did not finish"
            time.sleep(0.05)
        server.run_coroutine(_leave_while_tracing_is_switched_on(hub))
        assert hub.viewers == 0 and not hub.lock.locked()
        body = {"model": server.engine.served_model_name, "prompt": "Once upon a time", "max_tokens": 8}
        for _ in range(3):
            assert _post(server.url + "/completions", body)[0] == 200
        assert server.engine.tracer is None and core.trace_events == [] and taken == []
    finally:
        server.stop()


async def _leave_while_tracing_is_switched_on(hub) -> None:
    """A page whose stream is cancelled (its client left) after EngineCore switched tracing on for it, before
    the server had the reply: EngineCore's answer is held until the cancellation has been delivered."""
    import asyncio
    import contextlib
    core, entered, release = hub.engine.engine_core, asyncio.Event(), asyncio.Event()
    call = core.call_utility_async

    async def held(name: str, *args):
        result = await call(name, *args)
        if name == "enable_tracing":
            entered.set()
            await release.wait()
        return result

    core.call_utility_async = held
    try:
        page = hub.stream()
        first = asyncio.ensure_future(page.__anext__())
        await asyncio.wait_for(entered.wait(), 30)  # EngineCore traces now; the server has not heard yet
        first.cancel()  # the client left: its stream is cancelled
        release.set()  # then EngineCore's reply arrives
        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
            await asyncio.wait_for(first, 30)
        await page.aclose()
    finally:
        del core.call_utility_async


class _Source:
    def __init__(self) -> None:
        self.pending: list[dict] = []

    def take(self) -> list[dict]:
        events, self.pending = self.pending, []
        return events


def test_the_live_window_is_bounded_in_steps_and_in_events():
    from types import SimpleNamespace

    from minivllm.entrypoints.openai.trace_page import LiveTrace
    source = _Source()
    trace = LiveTrace({"num_gpu_blocks": 8}, 1, source.take, max_steps=1000, max_events=50)
    processed = SimpleNamespace(request_outputs=[], reqs_to_abort=[])
    for step in range(1, 201):
        source.pending = [{"kind": "schedule", "session": 1, "step": step},
                          *({"kind": "execute", "session": 1, "step": step} for _ in range(3))]
        trace.on_outputs(None, processed)
        assert len(trace.events) <= 50
    assert trace.next_seq == 800 and trace.first_seq == 800 - len(trace.events)  # the newest kept, oldest dropped
    few = LiveTrace({"num_gpu_blocks": 8}, 1, source.take, max_steps=3)
    for step in range(1, 11):
        source.pending = [{"kind": "schedule", "session": 1, "step": step}]
        few.on_outputs(None, processed)
    assert [e["step"] for e in few.events] == [8, 9, 10]


def test_redaction_keeps_counts_and_aliases_every_request_id():
    from minivllm.entrypoints.openai.trace_redact import RequestRedactor
    redact = RequestRedactor()
    submit = redact({"kind": "submit", "request_id": "chatcmpl-secret", "prompt": "my words",
                     "prompt_token_ids": [5, 6, 7], "max_tokens": 4})
    schedule = redact({"kind": "schedule", "num_scheduled_tokens": {"chatcmpl-secret": 3}, "waiting": [],
                       "running": ["chatcmpl-secret"], "scheduled_spec_decode_tokens": {"chatcmpl-secret": [9, 9]},
                       "scheduled_new_reqs": [{"req_id": "chatcmpl-secret", "block_ids": [[1]]}]})
    update = redact({"kind": "update", "outputs": [{"request_id": "chatcmpl-secret", "new_token_ids": [8],
                                                    "finish_reason": "stop", "stop_reason": "my stop"}],
                     "freed": {"chatcmpl-secret": [1]}, "note": "chatcmpl-secret"})
    assert submit == {"kind": "submit", "request_id": "req-1", "prompt": None, "prompt_token_ids": [None] * 3,
                      "max_tokens": 4}
    assert schedule["num_scheduled_tokens"] == {"req-1": 3} and schedule["running"] == ["req-1"]
    assert schedule["scheduled_spec_decode_tokens"] == {"req-1": [None, None]}
    assert schedule["scheduled_new_reqs"] == [{"req_id": "req-1", "block_ids": [[1]]}]
    assert update["outputs"] == [{"request_id": "req-1", "new_token_ids": [None], "finish_reason": "stop",
                                  "stop_reason": None}]
    assert update["freed"] == {"req-1": [1]} and update["note"] == "req-1"
    assert not re.search("secret|my words|my stop", json.dumps([submit, schedule, update]))


@pytest.mark.timeout(180)
def test_a_tensor_parallel_worker_failure_is_one_line_and_its_traceback_is_logged(tiny_llama_folder):
    """A call that raises in the ranks (here a method no Worker has) ends the engine with EngineDeadError: its
    message, which a server would hand to clients, is one line; the rank's traceback is in the log."""
    from minivllm import LLM
    from minivllm.engine.exceptions import EngineDeadError
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=False, max_model_len=64)
    try:
        with LogRecords() as logs, pytest.raises(EngineDeadError) as info:
            llm.llm_engine.engine_core.engine_core.model_executor.collective_rpc("no_such_method")
        message = str(info.value)
        assert "\n" not in message and "Traceback" not in message and not re.search(r"\.py\b", message), message
        assert "the worker of rank 0 raised AttributeError" in message and "no_such_method" in message, message
        assert "Traceback (most recent call last)" in logs.text()
    finally:
        llm.shutdown()
