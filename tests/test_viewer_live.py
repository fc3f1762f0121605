"""The live trace viewer of `minivllm serve` (GET /trace, minivllm/entrypoints/openai/trace_page.py) in headless Chromium.

A real `python -m minivllm serve` on 127.0.0.1 with the page open while three clients stream (the serve
trace's clients: B starts once A has 3 tokens, C once B has 2, so they overlap); the test also reads
/trace/events itself, the server's record, and checks the page at the steps where something happened
against it (started with --enable-trace-page --trace-page-show-requests, so the clients' ids and text are
shown). Then, on a redacted page: tracing is on only while a viewer is connected, and greedy tokens are the
same with no viewer, with one, and after it left; the window keeps the last --trace-max-steps steps.
"""
from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

import pytest

from test_viewer import READ_PAGE, assert_no_console_error, assert_step_matches_trace, browser, steps_of  # noqa: F401


class EventReader:
    """/trace/events read as the page reads it, on a thread: the window's events, the prelude, and a wake-up
    per message (tests wait on it with a timeout, never sleep). `close` shuts the socket down, which ends the
    thread's blocked read at once (closing the response alone would wait for the read's own timeout: the
    thread holds the response's buffer lock while it reads)."""

    def __init__(self, base: str) -> None:
        self.events: list[dict] = []
        self.prelude: list[dict] = []
        self.cond = threading.Condition()
        self.messages = 0
        url = urllib.parse.urlsplit(base)
        self.connection = http.client.HTTPConnection(url.hostname, url.port, timeout=120)
        self.connection.connect()
        self.socket = self.connection.sock
        self.connection.request("GET", "/trace/events")
        self.response = self.connection.getresponse()
        assert self.response.status == 200, self.response.status
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        try:
            for line in self.response:
                if not line.startswith(b"data: "):
                    continue
                m = json.loads(line[6:])
                with self.cond:
                    events = m["events"] if m["reset"] else self.events + m["events"]
                    self.events = [e for e in events if e["seq"] >= m["first_seq"]]
                    self.prelude = m["prelude"]
                    self.messages += 1
                    self.cond.notify_all()
        except (OSError, ValueError, http.client.HTTPException):
            return  # closed by the test

    def wait_for(self, predicate, timeout: float = 120) -> None:
        with self.cond:
            assert self.cond.wait_for(lambda: predicate(self), timeout), "the event stream did not get there"

    def finished(self) -> set[str]:
        return {o["request_id"] for e in self.events if e["kind"] == "update" for o in e["outputs"]
                if o["finish_reason"]}

    def close(self) -> None:
        self.socket.shutdown(socket.SHUT_RDWR)
        self.thread.join(timeout=30)
        assert not self.thread.is_alive(), "the reading thread did not end when its socket was shut down"
        self.response.close()
        self.connection.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except OSError:
        return None


@pytest.fixture
def serve_process():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", "--host", "127.0.0.1", "--port", str(port),
                             "--max-model-len", "256", "--uvicorn-log-level", "warning",
                             "--enable-trace-page", "--trace-page-show-requests"],  # the clients' ids on the page
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while _health(base + "/health") != 200:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the server did not start within 240 s"
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)


@pytest.mark.timeout(600)
def test_live_page_follows_three_streaming_clients(serve_process, browser, tmp_path):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import WebDriverWait

    from minivllm.entrypoints.cli.serve_trace import admitted_while_decoding, run_clients
    from minivllm.tracing.trace import Trace

    base = serve_process
    reader = EventReader(base)
    reader.wait_for(lambda r: r.messages >= 1)  # connected: tracing is on in EngineCore
    browser.get(base + "/trace")
    live_seq = lambda d: int(d.execute_script("return document.body.dataset.liveSeq ?? '-2'"))  # noqa: E731
    WebDriverWait(browser, 120).until(lambda d: live_seq(d) >= -1)  # the page has its first message (bounds a hang)
    texts = run_clients(base + "/v1", "SmolLM2-135M-Instruct")
    assert sorted(texts) == ["A", "B", "C"] and all(texts.values())
    reader.wait_for(lambda r: {"cmpl-A-0", "cmpl-B-0", "cmpl-C-0"} <= r.finished())
    with reader.cond:
        events, last_seq = list(reader.events), reader.events[-1]["seq"]
    WebDriverWait(browser, 120).until(lambda d: live_seq(d) >= last_seq)

    html = urllib.request.urlopen(base + "/trace", timeout=30).read().decode()
    data = json.loads(html.split('<script id="trace-data" type="application/json">')[1].split("</script>")[0])
    trace = {"info": data["trace"]["info"], "events": events}
    by_step = steps_of(trace)
    last = max(n for n, ev in by_step.items() if "update" in ev)
    assert browser.execute_script("return document.body.dataset.step") == str(max(by_step))  # it follows
    overlaps = admitted_while_decoding(Trace(trace["info"], events))
    assert overlaps, "the clients did not overlap"
    finishes = {n for n, ev in by_step.items() if any(o["finish_reason"] for o in ev.get("update", {"outputs": []})
                                                      ["outputs"])}
    for n in sorted({step for step, *_ in overlaps} | finishes | {last}):
        browser.execute_script(f"location.hash = '#step={n}'")
        page = browser.execute_script(READ_PAGE)
        assert page["step"] == n
        assert_step_matches_trace(page, by_step[n], trace)
        browser.save_screenshot(str(tmp_path / f"live-step-{n}.png"))
    step, new, decoding = overlaps[-1]
    browser.execute_script(f"location.hash = '#step={step}'")
    page = browser.execute_script(READ_PAGE)
    for short in new + decoding:  # the clients' request ids are on the page, in the queue they were in
        assert f"cmpl-{short}-0" in page["queues"]["running-after"]

    # The user moved off the newest step: a new request's steps arrive, the page stays where the user is.
    held = browser.execute_script("return document.body.dataset.step")
    body = json.dumps({"model": "SmolLM2-135M-Instruct", "prompt": "Hello", "max_tokens": 3}).encode()
    request = urllib.request.Request(base + "/v1/completions", body, {"Content-Type": "application/json",
                                                                      "X-Request-Id": "D"})
    urllib.request.urlopen(request, timeout=120).read()
    reader.wait_for(lambda r: "cmpl-D-0" in r.finished())
    with reader.cond:
        last_seq = reader.events[-1]["seq"]
    WebDriverWait(browser, 120).until(lambda d: live_seq(d) >= last_seq)
    assert browser.execute_script("return document.body.dataset.step") == held
    browser.find_element("tag name", "body").send_keys(Keys.END)  # back on the newest step: follow again
    assert browser.execute_script("return document.body.dataset.step") == str(max(steps_of({"events": reader.events})))
    assert_no_console_error(browser)
    reader.close()


@pytest.mark.timeout(600)
def test_tracing_only_while_a_viewer_is_connected_and_tokens_unchanged():
    """Greedy tokens: no viewer (tracing off), a viewer connected (on), the viewer gone (off again)."""
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread

    server = ServerThread(AsyncLLM.from_engine_args(EngineArgs(max_model_len=256)), enable_trace_page=True,
                          trace_max_steps=4)  # redacted (no --trace-page-show-requests): the window still adds up
    base, hub, core = server.url.removesuffix("/v1"), server.app.state.live_trace, server.engine.engine_core
    body = {"model": server.engine.served_model_name, "prompt": "The capital of France is", "max_tokens": 10,
            "temperature": 0, "ignore_eos": True}

    def complete() -> str:
        request = urllib.request.Request(server.url + "/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json"})
        return json.loads(urllib.request.urlopen(request, timeout=120).read())["choices"][0]["text"]

    try:
        untraced = complete()
        assert server.engine.tracer is None and core.trace_events == []  # no TraceEvents came: tracing is off
        reader = EventReader(base)
        reader.wait_for(lambda r: r.messages >= 1)
        assert hub.viewers == 1 and server.engine.tracer is not None
        assert complete() == untraced
        reader.wait_for(lambda r: r.finished())
        with reader.cond:  # the window: the last 4 steps of the 10-token request, not all of them
            assert sum(e["kind"] == "schedule" for e in reader.events) == 4
            assert [e["step"] for e in reader.events if e["kind"] == "schedule"] == [7, 8, 9, 10]
            # its submit and arrival left the window but are kept (it is alive until step 10), with its
            # token count as of step 7: the prompt plus the 6 tokens sampled in steps 1..6
            kinds = [e["kind"] for e in reader.prelude]
            assert kinds == ["submit", "arrival", "window"], kinds
            assert reader.prelude[-1]["num_tokens"] == {
                reader.prelude[0]["request_id"]: len(reader.prelude[0]["prompt_token_ids"]) + 6}
        reader.close()
        deadline = time.monotonic() + 30
        while hub.viewers or hub.lock.locked():  # the server notices the closed stream and switches tracing
            assert time.monotonic() < deadline, "tracing was not switched off within 30 s of the page leaving"
            time.sleep(0.05)
        assert complete() == untraced
        assert server.engine.tracer is None and core.trace_events == []  # off again: EngineCore sent no events
    finally:
        server.stop()


@pytest.mark.timeout(600)
def test_a_redacted_page_draws_every_step_without_the_request_text(browser, tiny_llama_folder):
    """--enable-trace-page alone: the viewer draws each step from the redacted events (token counts, blocks,
    aliases) with no console error, and nothing of the client's message or request id is on the page."""
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    from selenium.webdriver.support.ui import WebDriverWait

    server = ServerThread(AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_llama_folder), max_model_len=256)),
                          enable_trace_page=True)
    base = server.url.removesuffix("/v1")
    live_seq = lambda d: int(d.execute_script("return document.body.dataset.liveSeq ?? '-2'"))  # noqa: E731
    try:
        reader = EventReader(base)
        reader.wait_for(lambda r: r.messages >= 1)
        browser.get(base + "/trace")
        WebDriverWait(browser, 30).until(lambda d: live_seq(d) >= -1)
        body = {"model": server.engine.served_model_name, "max_tokens": 6, "ignore_eos": True,
                "messages": [{"role": "user", "content": "the secret word is periwinkle"}]}
        request = urllib.request.Request(server.url + "/chat/completions", json.dumps(body).encode(),
                                         {"Content-Type": "application/json", "X-Request-Id": "alice-4242"})
        urllib.request.urlopen(request, timeout=120).read()
        reader.wait_for(lambda r: r.finished())
        assert reader.finished() == {"req-1"}
        with reader.cond:
            last_seq = reader.events[-1]["seq"]
        WebDriverWait(browser, 60).until(lambda d: live_seq(d) >= last_seq)
        for n in sorted(steps_of({"events": reader.events})):
            browser.execute_script(f"location.hash = '#step={n}'")
            page = browser.execute_script(READ_PAGE)
            assert page["step"] == n
            text = browser.find_element("tag name", "body").text
            assert "periwinkle" not in text and "alice" not in text and "req-1" in text
        assert_no_console_error(browser)
        reader.close()
    finally:
        server.stop()
