"""Async scheduling in the trace viewer's first panel (minivllm/tracing/viewer/overlap.js), in headless Chromium.

The tiny random Llama runs three requests with a server's long ids twice, traced in-process: without async
scheduling, then with it, where the first request stops at a token it samples a few steps in (its stop token,
read off the first run: greedy tokens are the same either way). With async scheduling step N is scheduled while
step N-1 runs: the page draws both steps on one time axis, and the test compares every bar's pixels with the
times the trace recorded. It lists the placeholders each schedule() left in flight and the stopped request's token
that update_from_output dropped. Without async scheduling the page draws none of it. Nothing here asserts on how
long anything took: only that the drawing agrees with the recorded times.
"""
from __future__ import annotations

import json

import pytest

from test_viewer import (READ_PAGE, SCREENS, assert_no_console_error, assert_step_matches_trace, browser,  # noqa: F401
                         open_viewer, resize, steps_of)

IDS = ["cmpl-5a1e" + "0" * 28, "cmpl-5a1e" + "1" * 28, "chatcmpl-" + "c4" * 16]
PROMPTS = ["Once upon a time", "The capital of France is", "def fibonacci(n):"]


def traced(folder, tmp_path_factory, async_scheduling: bool, params: list) -> tuple[dict, object]:
    from minivllm import LLM
    from minivllm.tracing.html import write_html

    llm = LLM(str(folder), multiprocess=False, async_scheduling=async_scheduling, block_size=8, max_model_len=256)
    try:
        engine = llm.llm_engine
        engine.enable_tracing()
        engine.add_processed_requests([engine.process_inputs(i, p, s) for i, p, s in zip(IDS, PROMPTS, params)])
        while engine.has_unfinished_requests():
            engine.step()
        trace = engine.collect_trace()
        html = tmp_path_factory.mktemp("async" if async_scheduling else "sync") / "trace.html"
        write_html(trace, html, engine.config)
        return json.loads(json.dumps({"info": trace.info, "events": trace.events})), html
    finally:
        llm.shutdown()


def generated(trace: dict, req_id: str) -> list[int]:
    return [t for e in trace["events"] if e["kind"] == "update" for o in e["outputs"] if o["request_id"] == req_id
            for t in o["new_token_ids"]]


@pytest.fixture(scope="module")
def runs(tiny_llama_folder, tmp_path_factory):
    """{"sync": (trace, html), "async": (trace, html)}."""
    from minivllm import SamplingParams

    plain = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    sync = traced(tiny_llama_folder, tmp_path_factory, False, [plain] * 3)
    tokens = generated(sync[0], IDS[0])
    # a token first sampled at index 3 or later, so that the request stops there, with steps still to run
    stop = next(t for i, t in enumerate(tokens) if i >= 3 and t not in tokens[:i])
    stopping = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, stop_token_ids=[stop])
    return {"sync": sync, "async": traced(tiny_llama_folder, tmp_path_factory, True, [stopping, plain, plain])}


READ_ASYNC = """
const p = document.getElementById("p-stages"), view = p.querySelector("[data-async]");
const box = (n) => { const r = n.getBoundingClientRect(); return {left: r.left, right: r.right, width: r.width}; };
const out = {mode: view ? view.dataset.async : null, text: p.innerText, timeline: null,
             placeholders: [...p.querySelectorAll(".ph")].map((n) => [n.dataset.req, Number(n.dataset.n),
                                                                      n.querySelector(".chip").textContent]),
             dropped: [...p.querySelectorAll(".drop")].map((n) => [n.dataset.req, JSON.parse(n.dataset.tokens),
                                                                   n.textContent])};
const tl = p.querySelector(".timeline");
if (tl) {
  out.timeline = {
    lanes: [...tl.querySelectorAll(".tl-body .tl-lane")].map((l) => [l.querySelector(".tl-name").textContent,
                                                                     box(l.querySelector(".tl-track"))]),
    bars: [...tl.querySelectorAll(".tl-bar")].map((b) => ({kind: b.dataset.kind, step: Number(b.dataset.step),
                                                           text: b.textContent, ...box(b)})),
    ticks: [...tl.querySelectorAll(".tl-tick")].map((t) => ({step: Number(t.dataset.step), ...box(t)})),
    band: tl.querySelector(".tl-overlap") ? box(tl.querySelector(".tl-overlap")) : null,
    caption: tl.querySelector(".tl-caption").textContent, overlap: tl.querySelector(".tl-caption").dataset.overlap};
}
return out;
"""


def overlapped_step(trace: dict) -> int:
    """The first step N scheduled before step N-1's output was applied (its schedule event comes before that update)."""
    order = [(e["kind"], e["step"]) for e in trace["events"] if e["kind"] in ("schedule", "update")]
    return next(n for kind, n in order if kind == "schedule" and n > 1
                and order.index(("schedule", n)) < order.index(("update", n - 1)))


@pytest.mark.timeout(600)
def test_async_steps_are_drawn_overlapping_to_scale(runs, browser, tmp_path):
    """Step N's schedule() tick, its time in the batch queue and its execute_model, and step N-1's execute_model:
    each bar's left and right edges within 1.5 px of its recorded times on the axis; the overlap band from
    schedule() of N to the end of N-1's forward; the caption's numbers are the trace's."""
    trace, html = runs["async"]
    assert trace["info"]["async_scheduling"] is True
    by_step = steps_of(trace)
    n = overlapped_step(trace)
    sched, ex, pex = by_step[n]["schedule"], by_step[n]["execute"], by_step[n - 1]["execute"]
    began = sched["schedule_began"]
    times = [began, ex["began"], ex["ended"], pex["began"], pex["ended"]]
    t0, t1 = min(times), max(times)
    resize(browser, *SCREENS[0])
    open_viewer(browser, html, step=n)
    browser.execute_script("document.querySelector('#p-stages .timeline').scrollIntoView({block: 'center'})")
    browser.save_screenshot(str(tmp_path / "async-timeline-1280x720.png"))
    page = browser.execute_script(READ_ASYNC)
    assert page["mode"] == "on"
    tl = page["timeline"]
    assert [name for name, _ in tl["lanes"]] == [f"step {n - 1}", f"step {n}"]
    track = tl["lanes"][0][1]
    assert tl["lanes"][1][1]["left"] == track["left"] and tl["lanes"][1][1]["width"] == track["width"]
    x = lambda t: track["left"] + (t - t0) / (t1 - t0) * track["width"]  # noqa: E731

    def at(box, start, end):
        assert abs(box["left"] - x(start)) <= 1.5, (box, x(start))
        assert abs(box["right"] - max(x(end), x(start) + 2)) <= 1.5, (box, x(end))  # a bar is 2 px at least

    bars = {(b["kind"], b["step"]): b for b in tl["bars"]}
    assert set(bars) == {("execute", n - 1), ("queued", n), ("execute", n)}
    at(bars["execute", n - 1], pex["began"], pex["ended"])
    at(bars["queued", n], began, ex["began"])
    at(bars["execute", n], ex["began"], ex["ended"])
    assert bars["execute", n]["text"].startswith("execute_model")
    [tick] = tl["ticks"]
    assert tick["step"] == n and abs((tick["left"] + tick["right"]) / 2 - x(began)) <= 1.5
    if began < pex["ended"]:  # the overlap: drawn as a band over both rows, its numbers in the caption
        assert tl["overlap"] == "yes"
        at(tl["band"], began, pex["ended"])
        assert (f"schedule() of step {n} began {(began - pex['began']) * 1e3:.1f} ms into step {n - 1}'s "
                f"execute_model (which ran {(pex['ended'] - pex['began']) * 1e3:.1f} ms): the two overlap for "
                f"{(pex['ended'] - began) * 1e3:.1f} ms") in tl["caption"]
    else:
        assert tl["overlap"] == "no" and tl["band"] is None and "no overlap this time" in tl["caption"]
    assert_no_console_error(browser)


@pytest.mark.timeout(600)
def test_async_placeholders_dropped_tokens_and_steps(runs, browser):
    """At every step: the placeholders schedule() left (by alias), the tokens update_from_output dropped (the
    stopped request's, from the step scheduled before its stop was known), and the panels' other values of
    the step itself, though its execute and update events arrive after the next step was scheduled."""
    trace, html = runs["async"]
    by_step = steps_of(trace)
    dropped = {n: ev["update"]["dropped"] for n, ev in by_step.items() if ev.get("update", {}).get("dropped")}
    assert IDS[0] in {r for d in dropped.values() for r in d}, "the stopped request's next token was not dropped"
    stopped_at = next(n for n, ev in by_step.items() for o in ev.get("update", {}).get("outputs", [])
                      if o["request_id"] == IDS[0] and o["finish_reason"] == "stop")
    assert IDS[0] in dropped[stopped_at + 1]
    final = [o for e in trace["events"] if e["kind"] == "outputs" for o in e["outputs"] if o["request_id"] == IDS[0]][-1]
    assert final["finished"] and final["token_ids"] == generated(trace, IDS[0])  # the caller never got the dropped one
    open_viewer(browser, html)
    aliases = {}
    for n in range(1, max(by_step) + 1):
        page = browser.execute_script(READ_ASYNC)
        assert page["mode"] == "on" and page["timeline"] is not None, n
        assert {r: k for r, k, _ in page["placeholders"]} == by_step[n]["schedule"]["placeholders"], n
        for req, _, alias in page["placeholders"]:
            assert aliases.setdefault(req, alias) == alias and len(alias) <= 12
        assert not [i for i in IDS if i in page["text"]], n  # the short aliases, never a 40-character id
        assert {r: t for r, t, _ in page["dropped"]} == dropped.get(n, {}), n
        for req, tokens, text in page["dropped"]:
            assert f"finished in step {n - 1}" in text and "never given to the caller" in text
        if "update" in by_step[n]:
            assert_step_matches_trace(browser.execute_script(READ_PAGE), by_step[n], trace)
        else:  # the last step: scheduled, nothing to run
            assert n == max(by_step) and by_step[n]["schedule"]["total_num_scheduled_tokens"] == 0
            assert "no forward" in page["text"]
        browser.find_element("id", "next").click()
    assert len(set(aliases.values())) == len(aliases) == len(IDS)
    assert_no_console_error(browser)


@pytest.mark.timeout(300)
def test_sync_trace_draws_no_timeline(runs, browser):
    """Without async scheduling: one line saying so, no timeline, no placeholders, nothing dropped."""
    trace, html = runs["sync"]
    assert not trace["info"]["async_scheduling"]
    assert not any("schedule_began" in e or "began" in e or "dropped" in e for e in trace["events"])
    open_viewer(browser, html)
    for n in range(1, max(steps_of(trace)) + 1):
        page = browser.execute_script(READ_ASYNC)
        assert page["mode"] == "off" and page["timeline"] is None and page["placeholders"] == page["dropped"] == []
        assert "async scheduling: off" in page["text"]
        assert browser.find_elements("css selector", "#p-stages .async") == []
        browser.find_element("id", "next").click()
    assert_no_console_error(browser)
