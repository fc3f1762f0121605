"""The live trace of `minivllm serve`: GET /trace is the viewer, following the running engine's steps.

Mirrors nothing in vLLM (it has no trace viewer). The page is off unless the server was started with
--enable-trace-page (api_server.py); without --trace-page-show-requests every event is redacted here, in
the server, before it is stored or sent (entrypoints/openai/trace_redact.py: no request text, no token ids, request
ids as aliases). LiveTraceHub counts the open pages. The first one to connect to /trace/events switches
tracing on in EngineCore (the utility call `enable_tracing`, with a new session number) and hangs a
LiveTrace on the AsyncLLM; the last one to leave switches it off (`disable_tracing`) and drops it, also a
page that leaves while it is still being attached (its attach finishes, shielded, then it detaches). With
no page open no observer is attached: the steps run exactly as in a server without this feature (tested:
the same greedy tokens). Events a previous session left on the output pipe carry its number and are skipped.

LiveTrace keeps the last `max_steps` steps (`--trace-max-steps`), and at most MAX_LIVE_EVENTS events (the
oldest steps are dropped first; a burst of submits in one step can still pass it until that step leaves):
when a step leaves the window its events are dropped, except the submit and arrival events of requests
still alive; a "window" event carries, for those, their token count (prompt + sampled) as of the first
step kept, so the viewer's budget and block bookkeeping stay counted from recorded values. Each event gets
a sequence number; /trace/events is a Server-Sent Events stream: first the whole window (reset), then each
step's new events as they arrive (a page that fell behind the window gets the window again).
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import itertools
import json
import logging

import anyio

from minivllm.entrypoints.openai.cli_args import DEFAULT_TRACE_MAX_STEPS
from minivllm.entrypoints.openai.trace_redact import RequestRedactor
from minivllm.tracing.trace import Trace

logger = logging.getLogger("minivllm")
UTILITY_TIMEOUT_S = 10
MAX_LIVE_EVENTS = 20_000  # the window's hard bound, whatever --trace-max-steps says: the oldest steps go first


class LiveTrace(Trace):
    """A Trace bounded to its last max_steps steps, which wakes the pages waiting for new events."""

    def __init__(self, info: dict, session: int, source, max_steps: int = DEFAULT_TRACE_MAX_STEPS,
                 show_requests: bool = False, max_events: int = MAX_LIVE_EVENTS) -> None:
        super().__init__(info, source=source)
        if max_steps < 1:
            raise ValueError(f"max_steps must be at least 1, got {max_steps}.")
        self.session, self.max_steps, self.max_events = session, max_steps, max_events
        self.redact = None if show_requests else RequestRedactor()  # None: events as recorded
        self.first_seq = self.next_seq = 0  # seq of events[0], and of the next event recorded
        self.kept: dict[str, list[dict]] = {}  # live request id -> its submit/arrival events left the window
        self.num_tokens: dict[str, int] = {}  # live request id -> prompt + sampled tokens, as of the window
        self.changed = asyncio.Event()

    def extend(self, events: list[dict]) -> None:  # EngineCore's events: only this session's
        super().extend([e for e in events if e.get("session") == self.session])

    def on_submit(self, request, text) -> None:
        super().on_submit(request, text)
        self._recorded()

    def on_outputs(self, engine_core_outputs, processed) -> None:
        super().on_outputs(engine_core_outputs, processed)
        self._recorded()

    def _recorded(self) -> None:
        new = self.next_seq - self.first_seq
        if self.redact is not None:  # before the events are kept or sent anywhere
            self.events[new:] = [self.redact(e) for e in self.events[new:]]
        for e in self.events[new:]:
            e["seq"] = self.next_seq
            self.next_seq += 1
        steps = sum(e["kind"] == "schedule" for e in self.events)
        while steps > self.max_steps or (steps > 1 and len(self.events) > self.max_events):
            self._drop_oldest_step()
            steps -= 1
        self.changed.set()
        self.changed = asyncio.Event()

    def _drop_oldest_step(self) -> None:
        """Drop everything before the second schedule event (events before the first step go with it)."""
        cut = [i for i, e in enumerate(self.events) if e["kind"] == "schedule"][1]
        for e in self.events[:cut]:
            if e["kind"] in ("submit", "arrival"):
                self.kept.setdefault(e["request_id"], []).append(e)
                self.num_tokens[e["request_id"]] = (len(e["prompt_token_ids"]) if e["kind"] == "submit"
                                                    else e["num_prompt_tokens"])
            elif e["kind"] == "update":
                for o in e["outputs"]:
                    if o["finish_reason"]:
                        self._forget(o["request_id"])
                    elif o["request_id"] in self.num_tokens:
                        self.num_tokens[o["request_id"]] += len(o["new_token_ids"])
            elif e["kind"] == "abort":
                for r in e["request_ids"]:
                    self._forget(r)
        del self.events[:cut]
        self.first_seq += cut

    def _forget(self, request_id: str) -> None:
        self.kept.pop(request_id, None)
        self.num_tokens.pop(request_id, None)

    def message(self, after: int) -> tuple[dict, int]:
        """The SSE payload for a page that has every event up to seq `after`; and the new `after`."""
        reset = after < self.first_seq - 1
        events = self.events[max(0, after + 1 - self.first_seq):]
        prelude = [e for events_of in self.kept.values() for e in events_of]
        prelude.append({"kind": "window", "first_seq": self.first_seq, "num_tokens": dict(self.num_tokens)})
        return ({"reset": reset, "first_seq": self.first_seq, "prelude": prelude, "events": events},
                self.next_seq - 1)


class LiveTraceHub:
    """The pages open on /trace: tracing is on in EngineCore while at least one is."""

    def __init__(self, engine, max_steps: int = DEFAULT_TRACE_MAX_STEPS, show_requests: bool = False) -> None:
        if max_steps < 1:
            raise ValueError(f"--trace-max-steps must be at least 1, got {max_steps}.")
        self.engine, self.max_steps, self.show_requests = engine, max_steps, show_requests
        self.viewers = 0
        self.trace: LiveTrace | None = None
        self.sessions = itertools.count(1)
        self.lock = asyncio.Lock()

    async def attach(self) -> LiveTrace:
        async with self.lock:
            if self.viewers == 0:
                session = next(self.sessions)
                core = self.engine.engine_core
                await asyncio.wait_for(core.call_utility_async("enable_tracing", session), UTILITY_TIMEOUT_S)
                self.trace = LiveTrace(self.engine.info, session, core.take_trace_events, self.max_steps,
                                       self.show_requests)
                self.engine.tracer = self.trace
            self.viewers += 1
            return self.trace

    async def detach(self) -> None:
        async with self.lock:
            self.viewers -= 1
            if self.viewers == 0:
                self.engine.tracer, self.trace = None, None
                if not self.engine.errored:
                    with contextlib.suppress(Exception):  # EngineCore died meanwhile: nothing left to switch off
                        await asyncio.wait_for(self.engine.engine_core.call_utility_async("disable_tracing"),
                                               UTILITY_TIMEOUT_S)

    async def stream(self):
        """/trace/events: the window, then every new event, as Server-Sent Events, until the page leaves.

        The attach runs as a task of its own: a page that leaves while EngineCore is switching tracing on
        cancels only its wait, and the `finally` lets the attach finish and then detaches, so the last page
        to leave always switches tracing off."""
        attaching = asyncio.ensure_future(self.attach())
        try:
            trace = await asyncio.shield(attaching)
            after, first = trace.first_seq - 1, True
            while True:
                changed = trace.changed
                payload, new_after = trace.message(after)
                if first or payload["reset"] or payload["events"]:
                    payload["reset"] = payload["reset"] or first
                    yield f"data: {json.dumps(payload)}\n\n"
                    after, first = new_after, False
                await changed.wait()
        finally:
            with anyio.CancelScope(shield=True):  # the page left: switch tracing off even though we are cancelled
                try:
                    await attaching
                except Exception:
                    pass  # it never attached (EngineCore did not answer): nothing to detach
                else:
                    await self.detach()


def add_trace_routes(app, engine, event_stream_response, max_steps: int, show_requests: bool) -> LiveTraceHub:
    """GET /trace (the viewer, live) and /trace/events (its Server-Sent Events) on the server's app."""
    from fastapi.responses import HTMLResponse

    from minivllm.tracing.html import render_html
    hub = LiveTraceHub(engine, max_steps, show_requests)

    @app.get("/trace")
    async def trace_page() -> HTMLResponse:
        """The trace viewer, live: it follows /trace/events (tracing is on only while such a page is open)."""
        info = {**engine.info, "requests_redacted": not show_requests}  # the viewer can say why text is missing
        return HTMLResponse(render_html(Trace(info), engine.config, live="/trace/events"))

    @app.get("/trace/events")
    async def trace_events():
        return event_stream_response(hub.stream())

    return hub


def is_loopback(host: str) -> bool:
    """127.0.0.1, ::1, localhost: only this machine can connect."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def announce_trace_page(host: str, show_requests: bool) -> None:
    """The start-up log line of a server with the page on, and a warning when other machines can reach it."""
    shown = ("and every request's text, token ids and request id (--trace-page-show-requests)" if show_requests
             else "with request ids as aliases; no request text or token ids")
    logger.info("Live trace page on at /trace and /trace/events (--enable-trace-page), open to every client that "
                "can reach the server: each step's batch sizes, token counts, block ids and queues, %s.", shown)
    if not is_loopback(host):
        logger.warning("--host %s is not a loopback address: anyone on the network can open /trace and watch "
                       "every client's requests%s. Leave out --enable-trace-page on a shared server.", host,
                       ", their prompts and outputs included" if show_requests else "")
