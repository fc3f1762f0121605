"""The trace viewer (`python -m minivllm trace --html FILE`) in a real headless browser.

Debian's chromium, driven by selenium through Debian's chromedriver (both at fixed paths: selenium-manager
never runs, nothing is downloaded). Each of the five `make trace` runs (default, chunked prefill, a 6-block
pool that preempts, a shared prefix, n-gram speculative decoding) is traced once per module; the test opens
the written file from disk, steps through every step with the "next" button, and at each step where something
happens compares what the page draws (read back from its data- attributes) with the JSON trace of the same
run; at every step, the drafts each request carried, their verification and the rollback.
"""
from __future__ import annotations

import io
import json
import os
import re
from pathlib import Path

import pytest

from conftest import CHROMEDRIVER, CHROMIUM, quit_chromium, start_chromium

INSTALL = "apt-get install -y chromium chromium-driver (as root; `make setup` runs it) and pip install selenium"
SHARED = "You are a helpful assistant who answers in short, plain sentences. "
RUNS = {"default": [], "chunked": ["--max-num-batched-tokens", "3"],
        "preemption": ["--num-blocks", "6", "--block-size", "8"],
        # 8-token blocks: this prefix is 13 tokens, so with 16-token blocks no block is all prefix and nothing hits
        "shared_prefix": ["--shared-prefix", SHARED, "--block-size", "8"],
        # a prompt that repeats itself, so n-gram drafts are accepted (4 of 4) and, past the copy, rejected
        "spec": ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                                     "prompt_lookup_max": 4, "prompt_lookup_min": 1}),
                 "--prompt", "Copy this list exactly: apples, pears, plums, figs, dates, limes. Copy: apples, pears,",
                 "--max-tokens", "16", "--neighbours", "1"]}
EVENT_KINDS = ["admission", "prefix hit", "preemption", "resume", "lazy eviction", "rejection", "finish"]

# Everything one step draws, read in one round trip.
READ_PAGE = """
const data = (sel, attr) => [...document.querySelectorAll(sel)].map((n) => n.getAttribute(attr));
const out = {step: Number(document.body.dataset.step), label: document.getElementById("step-label").textContent,
             queues: {}, arrays: {}, blocks: {}, fields: {}};
document.querySelectorAll("[data-queue]").forEach((q) => out.queues[q.dataset.queue] = JSON.parse(q.dataset.ids));
document.querySelectorAll(".arr").forEach((a) => out.arrays[a.dataset.name] = JSON.parse(a.dataset.values));
document.querySelectorAll(".blk").forEach((b) => out.blocks[b.dataset.block] =
    {owners: b.dataset.owners ? b.dataset.owners.split(",") : [], ref_cnt: Number(b.dataset.refCnt)});
document.querySelectorAll("[data-field][data-ids]").forEach((f) => out.fields[f.dataset.field] = JSON.parse(f.dataset.ids));
const grid = document.querySelector(".grid");
out.num_blocks = Number(grid.dataset.numBlocks);
out.shown = Number(grid.dataset.shown);
out.sampled = {};
out.kept = {};
document.querySelectorAll('#p-sample tr[data-req] td[data-field="sampled"]').forEach((td) => {
    out.sampled[td.parentNode.dataset.req] = td.textContent;
    if (td.dataset.tokens) out.kept[td.parentNode.dataset.req] = JSON.parse(td.dataset.tokens);
});
out.spec = null;  // the speculative-decoding panel, if drawn: per request, what it shows
const spec = document.getElementById("p-spec");
if (spec) {
  out.spec = {};
  spec.querySelectorAll(".verify[data-req]").forEach((v) => {
    const roll = v.querySelector('[data-field="rollback"]');
    out.spec[v.dataset.req] = {
        drafts: JSON.parse(v.dataset.drafts), kept: v.dataset.kept ? JSON.parse(v.dataset.kept) : null,
        accepted: Number(v.dataset.accepted), rejected: Number(v.dataset.rejected), target: Number(v.dataset.target),
        bonus: v.dataset.bonus, statuses: [...v.querySelectorAll(".tok[data-status]")].map((t) => t.dataset.status),
        draft_cells: [...v.querySelectorAll(".tok[data-status]")].map((t) => Number(t.dataset.token)),
        computed: roll ? [Number(roll.dataset.from), Number(roll.dataset.to)] : null,
        rollback_text: roll ? roll.textContent : null};
  });
}
out.draft_input_cells = [...document.querySelectorAll('.arr[data-name="input_ids"] .cell.draft')].map(
    (c) => Number(c.dataset.i));
out.mark_kinds = [...document.querySelectorAll(".markrow")].map((r) => r.dataset.kind);
return out;
"""


@pytest.fixture
def browser():
    """A fresh headless Chromium per test, started after the run's trace is made (a tab idle through a long
    engine run on a loaded machine was seen to crash)."""
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    if webdriver is None or not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no headless browser for the viewer test under CI: {INSTALL}")
        pytest.skip(f"no headless browser (needs {CHROMIUM}, {CHROMEDRIVER}, selenium): {INSTALL}")
    driver = start_chromium("1600,2300", page_load_timeout=120)
    try:
        yield driver
    finally:
        quit_chromium(driver)


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory):
    """One traced run of the real engine: (name, trace JSON as dict, path of the --html file)."""
    from minivllm.entrypoints.cli.trace import add_trace_arguments, run_trace
    from minivllm.tracing.render import make_console
    import argparse

    folder = tmp_path_factory.mktemp(request.param)
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    args = parser.parse_args(["--in-process", "--json", str(folder / "trace.json"),
                              "--html", str(folder / "trace.html"), *RUNS[request.param]])
    run_trace(args, console=make_console(io.StringIO(), width=100))
    return request.param, json.loads((folder / "trace.json").read_text()), folder / "trace.html"


def steps_of(trace: dict) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for e in trace["events"]:
        if "step" in e:
            out.setdefault(e["step"], {})[e["kind"]] = e
    return out


def event_steps(trace: dict) -> dict[str, set[int]]:
    """The steps where each kind of event happens, read straight off the JSON (lazy eviction is left out:
    telling it needs the full-block bookkeeping the viewer does, so the test checks it is seen at all)."""
    kinds = {k: set() for k in EVENT_KINDS}
    for n, ev in steps_of(trace).items():
        sched, cached = ev["schedule"], ev["schedule"]["scheduled_cached_reqs"]
        block_size = trace["info"]["block_size"]
        if sched["scheduled_new_reqs"]:
            kinds["admission"].add(n)
        if any(r["num_computed_tokens"] >= block_size for r in sched["scheduled_new_reqs"]):
            kinds["prefix hit"].add(n)
        if sched["preempted_req_ids"]:
            kinds["preemption"].add(n)
        for resumed, computed in zip(cached["resumed_from_preemption"], cached["num_computed_tokens"]):
            if resumed:
                kinds["resume"].add(n)
                if computed >= block_size:
                    kinds["prefix hit"].add(n)
        if any(o["finish_reason"] for o in ev["update"]["outputs"]):
            kinds["finish"].add(n)
        if any(v["num_rejected"] for v in ev["update"].get("spec_decode", {}).values()):
            kinds["rejection"].add(n)
    return kinds


def speculative(trace: dict) -> bool:
    return any(e.get("scheduled_spec_decode_tokens") for e in trace["events"] if e["kind"] == "schedule")


def open_viewer(browser, html: Path, step: int | None = None) -> None:
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get("about:blank")  # a fresh load: the same file with another hash would only fire hashchange
    browser.get(html.as_uri() + ("" if step is None else f"#step={step}"))
    WebDriverWait(browser, 120).until(lambda d: d.execute_script("return document.body.dataset.ready") == "1")  # a hang


def assert_no_console_error(browser) -> None:
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], errors


def assert_step_matches_trace(page: dict, ev: dict, trace: dict) -> None:
    sched, update = ev["schedule"], ev["update"]
    # The queues right after schedule() and after update_from_output(), head first.
    assert page["queues"]["waiting-after"] == sched["waiting"]
    assert page["queues"]["running-after"] == sched["running"]
    assert page["queues"]["waiting-updated"] == update["waiting"]
    assert page["queues"]["running-updated"] == update["running"]
    assert page["fields"]["finished_req_ids"] == sched["finished_req_ids"]
    assert page["fields"]["preempted_req_ids"] == sched["preempted_req_ids"]
    # The packed batch, array by array.
    batch = ev["execute"]["batch"]
    for name in ("input_ids", "positions", "slot_mapping", "num_scheduled_tokens", "query_start_loc", "seq_lens",
                 "logits_indices"):
        assert page["arrays"][name] == batch[name], name
    spec = update.get("spec_decode", {})
    assert {r: int(t) for r, t in page["sampled"].items() if r not in spec and t.isdigit()} == {
        r: t for r, t in ev["execute"]["sampled"].items() if r not in spec}
    # a request that verified drafts: every token it kept, the first of them the one execute recorded
    assert page["kept"] == {r: v["sampled_token_ids"] for r, v in spec.items()}
    assert all(page["kept"][r][0] == ev["execute"]["sampled"][r] for r in spec)
    # The pool: every scheduled request owns its block table's blocks; a block's ref_cnt is its owner count.
    blocks = page["blocks"]
    assert page["num_blocks"] == trace["info"]["num_gpu_blocks"]
    assert blocks["0"]["owners"] == []  # block 0 is reserved
    for req_id, table in sched["block_tables"].items():
        for b in table:
            assert req_id in blocks[str(b)]["owners"], (req_id, b)
    holders = {}
    for table in sched["block_tables"].values():
        for b in table:
            holders[b] = holders.get(b, 0) + 1
    every_runner_scheduled = set(sched["running"]) == set(sched["num_scheduled_tokens"])
    for b, count in holders.items():
        ref_cnt = blocks[str(b)]["ref_cnt"]
        assert ref_cnt == len(blocks[str(b)]["owners"])
        assert ref_cnt == count if every_runner_scheduled else ref_cnt >= count, (b, ref_cnt, count)
    # The engine's own free count agrees with the blocks the page draws without an owner.
    unowned = sum(1 for b, blk in blocks.items() if b != "0" and not blk["owners"])
    assert unowned + page["num_blocks"] - page["shown"] == sched["num_free_blocks"]


def assert_drafts_match_trace(page: dict, n: int, by_step: dict[int, dict], trace: dict) -> None:
    """The speculative-decoding panel of step n against the JSON: none at all in a run without drafts."""
    if not speculative(trace):
        assert page["spec"] is None and "rejection" not in page["mark_kinds"]
        assert page["draft_input_cells"] == []
        return
    ev = by_step[n]
    sched, spec = ev["schedule"], ev["update"].get("spec_decode", {})
    drafts = sched.get("scheduled_spec_decode_tokens", {})
    assert set(page["spec"]) == set(drafts) == set(spec), n
    cached = sched["scheduled_cached_reqs"]
    start = dict(zip(cached["req_ids"], cached["num_computed_tokens"]))
    batch = ev["execute"]["batch"]
    draft_rows = []
    for req_id, shown in page["spec"].items():
        v, d = spec[req_id], len(drafts[req_id])
        assert shown["drafts"] == shown["draft_cells"] == drafts[req_id] == v["draft_token_ids"]
        assert shown["kept"] == v["sampled_token_ids"] and shown["target"] == v["sampled_token_ids"][-1]
        assert (shown["accepted"], shown["rejected"]) == (v["num_accepted"], v["num_rejected"])
        assert shown["statuses"] == ["accepted"] * v["num_accepted"] + ["rejected"] * v["num_rejected"]
        assert shown["bonus"] == ("true" if v["num_rejected"] == 0 else "false")
        # the rejection sampler's rule, on the recorded tokens: the accepted drafts are the kept prefix
        a = v["num_accepted"]
        assert v["sampled_token_ids"][:a] == drafts[req_id][:a] and len(v["sampled_token_ids"]) == a + 1
        assert a == d or v["sampled_token_ids"][a] != drafts[req_id][a]
        # num_computed_tokens once scheduled (every draft counts), then less the rejected ones
        computed = start[req_id] + sched["num_scheduled_tokens"][req_id]
        assert shown["computed"] == [computed, computed - v["num_rejected"]], (n, req_id)
        assert f"(rolled back {v['num_rejected']})" in shown["rollback_text"]
        later = by_step.get(n + 1, {}).get("schedule", {}).get("scheduled_cached_reqs", {"req_ids": []})
        if req_id in later["req_ids"]:  # the next schedule() starts from the rolled-back count
            i = later["req_ids"].index(req_id)
            assert later["resumed_from_preemption"][i] or later["num_computed_tokens"][i] == shown["computed"][1]
        row = batch["req_ids"].index(req_id)
        end = batch["query_start_loc"][row + 1]
        draft_rows += range(end - d, end)
        assert batch["input_ids"][end - d:end] == drafts[req_id]
    assert page["draft_input_cells"] == sorted(draft_rows)


@pytest.mark.timeout(900)
def test_viewer_steps_through_the_trace(run, browser, tmp_path):
    name, trace, html = run
    by_step = steps_of(trace)
    last = max(by_step)
    eventful = set().union(*event_steps(trace).values()) | {1, last}
    open_viewer(browser, html)
    next_button = browser.find_element("id", "next")
    for n in range(1, last + 1):
        page = browser.execute_script(READ_PAGE)
        assert page["step"] == n and page["label"] == f"step {n} / {last}"
        if n in eventful:
            assert_step_matches_trace(page, by_step[n], trace)
        assert_drafts_match_trace(page, n, by_step, trace)
        next_button.click()
    assert browser.execute_script("return document.body.dataset.step") == str(last)  # "next" stops at the end
    assert_no_console_error(browser)


@pytest.mark.timeout(300)
def test_viewer_marks_events_and_opens_step_from_hash(run, browser, tmp_path):
    from selenium.webdriver.common.keys import Keys

    name, trace, html = run
    expected = event_steps(trace)
    open_viewer(browser, html)
    for kind in EVENT_KINDS:
        marks = browser.find_elements("css selector", f'.markrow[data-kind="{kind}"] .mark')
        steps = [int(m.get_attribute("data-step")) for m in marks]
        if kind != "lazy eviction":
            assert set(steps) == expected[kind], kind
        if steps:  # a marker jumps to its step; one screenshot per kind of event
            marks[0].click()
            assert browser.execute_script("return location.hash") == f"#step={steps[0]}"
            assert browser.execute_script("return document.body.dataset.step") == str(steps[0])
            browser.save_screenshot(str(tmp_path / f"{name}-{kind.replace(' ', '-')}.png"))
    # #step=N opens step N, from a fresh load; the arrow keys move one step.
    target = min(set().union(*expected.values()) - {1}, default=2)
    open_viewer(browser, html, step=target)
    page = browser.execute_script(READ_PAGE)
    assert page["step"] == target
    assert_step_matches_trace(page, steps_of(trace)[target], trace)
    browser.find_element("tag name", "body").send_keys(Keys.ARROW_RIGHT)
    assert browser.execute_script("return document.body.dataset.step") == str(target + 1)
    browser.find_element("tag name", "body").send_keys(Keys.ARROW_LEFT, Keys.ARROW_LEFT)
    assert browser.execute_script("return document.body.dataset.step") == str(target - 1)
    # The article's slot formula for a slot_mapping cell the reader points at.
    cells = browser.find_elements("css selector", '.arr[data-name="slot_mapping"] .cell')
    batch = steps_of(trace)[target - 1]["execute"]["batch"]
    cells[-1].click()
    formula = browser.find_element("id", "slot-formula")
    pos, bs = batch["positions"][-1], trace["info"]["block_size"]
    assert formula.get_attribute("data-slot") == str(batch["slot_mapping"][-1])
    assert f"block_table[{pos} // {bs}] * {bs} + {pos} % {bs}" in formula.text
    assert_no_console_error(browser)
    # What each run is there to show is on the page.
    if name == "preemption":
        assert expected["preemption"] and expected["resume"]
    if name == "shared_prefix":
        open_viewer(browser, html, step=min(expected["prefix hit"]))
        shared = browser.execute_script(READ_PAGE)["blocks"]
        assert max(b["ref_cnt"] for b in shared.values()) >= 2
    if name == "chunked":
        open_viewer(browser, html, step=1)
        assert browser.find_elements("css selector", "#p-budget .seg.clamped")
    if name == "spec":  # drafts all accepted in one step, rejected (rolled back) in another
        verified = [v for e in trace["events"] if e["kind"] == "update" for v in e["spec_decode"].values()]
        assert any(v["num_rejected"] == 0 and len(v["draft_token_ids"]) == 4 for v in verified)
        assert any(v["num_accepted"] == 0 and len(v["draft_token_ids"]) == 4 for v in verified)
        assert expected["rejection"]


def test_html_is_self_contained(run):
    name, trace, html = run
    page = html.read_text()
    assert "<script src" not in page and "@import" not in page
    # the one <link> is the empty inline favicon (no /favicon.ico request): nothing is fetched
    assert all(href.startswith("data:") for href in re.findall(r'<link[^>]*href="([^"]*)"', page))
    assert "http://" not in page.replace("http://www.w3.org", "") and "https://" not in page
    start = page.index('<script id="trace-data" type="application/json">') + len(
        '<script id="trace-data" type="application/json">')
    embedded = json.loads(page[start:page.index("</script>", start)])
    assert embedded["trace"]["events"] == trace["events"]  # the very trace --json writes
    assert embedded["config"]["max_num_batched_tokens"] == int(dict(zip(RUNS[name], RUNS[name][1:])).get(
        "--max-num-batched-tokens", 8192))


def test_a_prompt_cannot_end_the_embedded_trace():
    """A prompt holding "</script>" stays data: the page still has exactly its own two closing tags."""
    from minivllm.tracing.html import render_html
    from minivllm.tracing.trace import Trace

    prompt = "</script><script>alert(1)</script>"
    trace = Trace({"num_gpu_blocks": 4, "block_size": 16, "pid": 1}, [
        {"kind": "submit", "process": "caller", "pid": 1, "request_id": "0", "prompt": prompt,
         "prompt_token_ids": [1, 2], "max_tokens": 1}], caller_pid=1)
    page = render_html(trace)
    assert page.count("</script>") == 2
    start = page.index('type="application/json">') + len('type="application/json">')
    assert json.loads(page[start:page.index("</script>", start)])["trace"]["events"][0]["prompt"] == prompt


# ---- The viewer in a lecture hall: a projector's screen, a lecturer scrolling, a server's long request ids.

SCREENS = [(1280, 720), (1024, 768)]  # window sizes, as a laptop on a projector gives them


def resize(browser, width: int, height: int) -> None:
    browser.set_window_size(width, height)
    assert browser.execute_script("return innerWidth") <= width


def scroll_to(browser, y: int) -> None:
    """Scroll, then wait until the page's scroll handler ran (a frame later)."""
    from selenium.webdriver.support.ui import WebDriverWait
    browser.execute_script(f"window.scrollTo(0, {y}); requestAnimationFrame(() => requestAnimationFrame(() => "
                           "document.body.dataset.scrolled = String(scrollY)));")
    WebDriverWait(browser, 10).until(lambda d: d.execute_script("return document.body.dataset.scrolled")
                                     == str(d.execute_script("return scrollY")))


READ_HEADER = """
const header = document.querySelector("header").getBoundingClientRect();
const nav = [...document.querySelectorAll("nav > *")].filter((n) => n.getClientRects().length)
  .map((n) => { const r = n.getBoundingClientRect(); return {id: n.id, top: r.top, bottom: r.bottom, left: r.left,
                                                              right: r.right}; });
return {height: header.height, bottom: header.bottom, viewport: innerHeight, nav,
        panels_top: document.getElementById("panels").getBoundingClientRect().top + scrollY,
        brief: document.getElementById("brief").textContent};
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("screen", SCREENS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_header_collapses_to_one_line_while_scrolling(run, browser, screen):
    """Scrolled, the header is one line (prev, slider, next, the step, its events in brief) and takes under a
    seventh of the screen; it stays usable (next moves the step); at the top it is whole again; nothing under
    it moves when it collapses."""
    name, trace, html = run
    resize(browser, *screen)
    step = min(set().union(*event_steps(trace).values()) - {1}, default=2)
    open_viewer(browser, html, step=step)
    top = browser.execute_script(READ_HEADER)
    scroll_to(browser, 400)
    page = browser.execute_script(READ_HEADER)
    assert page["height"] / page["viewport"] < 1 / 7, (page["height"], page["viewport"])
    assert [n["id"] for n in page["nav"]] == ["prev", "slider", "next", "step-label", "brief"]
    middle = [(n["top"] + n["bottom"]) / 2 for n in page["nav"]]
    assert max(middle) - min(middle) < 4 and page["nav"][-1]["right"] <= screen[0]  # one line, on screen
    assert page["panels_top"] == top["panels_top"]  # the panels did not jump when the header collapsed
    kinds = browser.execute_script("return [...document.querySelectorAll('#events li[data-kind]')]"
                                   ".map((li) => li.dataset.kind)")
    assert all(kind in page["brief"] for kind in kinds) and (kinds or page["brief"] == "a plain step")
    browser.find_element("id", "next").click()
    assert browser.execute_script("return document.body.dataset.step") == str(step + 1)
    assert browser.execute_script(READ_HEADER)["height"] == page["height"]
    browser.find_element("id", "brief").click()  # opens the whole header over the page
    assert browser.find_element("id", "marks").is_displayed()
    scroll_to(browser, 0)
    assert browser.execute_script(READ_HEADER)["height"] > 2 * page["height"]
    assert browser.find_element("css selector", "h1").is_displayed()
    assert_no_console_error(browser)


READ_BUDGET = """
return [...document.querySelectorAll("#p-budget .bar")].map((bar) => ({
    kind: bar.dataset.bar, span: Number(bar.dataset.span), inner: bar.clientWidth,
    segs: [...bar.querySelectorAll(".seg")].map((s) => ({n: Number(s.dataset.n), req: s.dataset.req || null,
                                                         width: s.getBoundingClientRect().width}))}));
"""


@pytest.mark.timeout(300)
def test_budget_bar_is_drawn_to_scale(run, browser):
    """A segment's width over the bar's is its tokens over max_num_batched_tokens (a decode step's 3 of 8192:
    a sliver, not 80% of the bar); a step spending under a tenth of the budget is drawn again magnified,
    against the first `span` tokens, and the page says by how much."""
    name, trace, html = run
    limit = int(dict(zip(RUNS[name], RUNS[name][1:])).get("--max-num-batched-tokens", 8192))
    resize(browser, *SCREENS[0])
    by_step = steps_of(trace)
    for n in sorted({1, 2, max(by_step)}):
        open_viewer(browser, html, step=n)
        total = by_step[n]["schedule"]["total_num_scheduled_tokens"]
        bars = browser.execute_script(READ_BUDGET)
        budget = bars[0]
        assert budget["kind"] == "budget" and budget["span"] == limit
        assert sum(s["n"] for s in budget["segs"] if s["req"]) == total
        for bar in bars:
            for seg in bar["segs"]:  # to within a pixel of its share
                assert abs(seg["width"] - bar["inner"] * seg["n"] / bar["span"]) < 1, (n, bar["kind"], seg)
        magnified = [b for b in bars if b["kind"] == "magnified"]
        if total / limit < 0.1:
            assert len(magnified) == 1 and total <= magnified[0]["span"] < limit
            label = browser.find_element("css selector", "#p-budget .barlabel.magnified").text
            factor = limit / magnified[0]["span"]
            assert f"magnified ×{factor:g}" in label and f"first {magnified[0]['span']} of the {limit} tokens" in label
        else:
            assert magnified == []
    assert_no_console_error(browser)


def assert_forward_context_matches_trace(browser, ev: dict) -> None:
    """Part 4's panel at this step: attn_metadata's fields, block_table by batch row and request, and the
    layer's kv_cache written exactly at slot_mapping's slots, each by its request."""
    a, batch = ev["execute"]["attention"], ev["execute"]["batch"]
    # what the layer pulled is what the runner packed
    assert a["slot_mapping"] == batch["slot_mapping"] and a["block_table"] == batch["block_table"]
    assert a["query_start_loc"] == batch["query_start_loc"] and a["seq_lens"] == batch["seq_lens"]
    page = browser.execute_script("""
        const p = document.getElementById("p-fwd"), out = {fields: {}};
        p.querySelectorAll("tr[data-field]").forEach((r) => out.fields[r.dataset.field] = JSON.parse(r.dataset.value));
        out.rows = [...p.querySelectorAll("tr.fwd-bt")].map((r) => [Number(r.dataset.row), r.dataset.req,
                                                                     r.textContent]);
        out.written = [...p.querySelectorAll(".cell.kv.written")].map((c) => [Number(c.dataset.slot),
                                                                              Number(c.dataset.token), c.dataset.req]);
        out.shape = JSON.parse(p.querySelector(".kvview").dataset.shape);
        out.text = p.innerText;
        return out;""")
    for name in ("num_actual_tokens", "max_query_len", "max_seq_len", "query_start_loc", "seq_lens", "slot_mapping"):
        assert page["fields"][name] == a[name], name
    assert [(r, req) for r, req, _ in page["rows"]] == list(enumerate(batch["req_ids"]))
    for r, req, text in page["rows"]:
        assert text.startswith(f"block_table[{r}]row {r}: ")
    row_of = [r for r in range(len(batch["req_ids"]))
              for _ in range(batch["query_start_loc"][r], batch["query_start_loc"][r + 1])]
    assert sorted(map(tuple, page["written"])) == sorted((slot, i, batch["req_ids"][row_of[i]])
                                             for i, slot in enumerate(a["slot_mapping"]))
    assert page["shape"] == a["kv_cache_shape"] and a["kv_cache_shape"][1] == ev["num_gpu_blocks"]
    assert a["layer_name"] in page["text"] and "get_attention_context" in page["text"]


@pytest.mark.timeout(600)
def test_forward_context_panel_shows_what_the_layer_pulled(run, browser):
    name, trace, html = run
    by_step = steps_of(trace)
    open_viewer(browser, html)
    next_button = browser.find_element("id", "next")
    for n in range(1, max(by_step) + 1):
        if "execute" in by_step[n]:
            assert_forward_context_matches_trace(browser, {**by_step[n], "num_gpu_blocks":
                                                           trace["info"]["num_gpu_blocks"]})
        assert browser.find_elements("id", "p-ranks") == []  # drawn only under tensor parallelism
        next_button.click()
    assert_no_console_error(browser)


@pytest.mark.timeout(300)
def test_marks_labels_and_block_tables_read_at_1024(run, browser):
    """At 1024x768: no two step marks overlap and none is dropped; no array name is cut off or runs into its
    cells; block_table is drawn row by row, each row named by its batch row and its request; the slot formula
    names each kind of index it uses."""
    name, trace, html = run
    resize(browser, 1024, 768)
    by_step = steps_of(trace)
    step = max(n for n, ev in by_step.items() if len(ev["execute"]["batch"]["req_ids"]) == max(
        len(e["execute"]["batch"]["req_ids"]) for e in by_step.values() if "execute" in e))
    open_viewer(browser, html, step=step)
    marks = browser.execute_script("""
        return [...document.querySelectorAll(".markrow")].map((row) => [row.dataset.kind,
            [...row.querySelectorAll(".mark")].map((m) => { const r = m.getBoundingClientRect();
                return {step: Number(m.dataset.step), shown: !m.hidden && r.width > 0,
                        box: [r.left, r.top, r.right, r.bottom]}; })]);""")
    expected = event_steps(trace)
    for kind, row in marks:
        if kind != "lazy eviction":
            assert {m["step"] for m in row} == expected[kind]
        assert all(m["shown"] for m in row), kind
        for i, m in enumerate(row):
            for other in row[i + 1:]:
                (l1, t1, r1, b1), (l2, t2, r2, b2) = m["box"], other["box"]
                assert r1 <= l2 or r2 <= l1 or b1 <= t2 or b2 <= t1, (kind, m["step"], other["step"])
    cut = browser.execute_script("""
        return [...document.querySelectorAll(".aname")].filter((a) => {
            const next = a.nextElementSibling, r = a.getBoundingClientRect();
            return a.scrollWidth > a.clientWidth || (next && next.getBoundingClientRect().left < r.right - 0.5 &&
                                                     next.getBoundingClientRect().top < r.bottom);
        }).map((a) => a.textContent);""")
    assert cut == []
    batch = by_step[step]["execute"]["batch"]
    rows = browser.execute_script("""
        return [...document.querySelectorAll("#p-batch .btrow")].map((r) => [Number(r.dataset.row), r.dataset.req,
            JSON.parse(r.dataset.blocks), r.querySelector(".aname").textContent, r.querySelector(".rowof").textContent]);""")
    assert [(r, req, blocks) for r, req, blocks, _, _ in rows] == [
        (r, req, blocks) for r, (req, blocks) in enumerate(zip(batch["req_ids"], batch["block_table"]))]
    for r, req, _, label, rowof in rows:
        assert label == f"block_table[{r}]" and rowof == f"row {r}: {req}"
    # the slot formula for the last token: every index named by its kind
    cells = browser.find_elements("css selector", '.arr[data-name="slot_mapping"] .cell')
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", cells[-1])
    cells[-1].click()
    text = " ".join(browser.find_element("id", "slot-formula").text.split())
    i, r, pos, bs = len(cells) - 1, len(batch["req_ids"]) - 1, batch["positions"][-1], trace["info"]["block_size"]
    phys = batch["block_table"][r][pos // bs]
    assert f"batch token {i} (index into the packed batch) · batch row {r} = request {batch['req_ids'][r]} · " \
           f"position {pos} (index in the request's tokens)" in text
    assert f"logical block {pos} // {bs} = {pos // bs} · physical block block_table[row {r}][{pos // bs}] = {phys}" in text
    assert f"= {phys * bs + pos % bs} (slot_mapping[{i}] = {batch['slot_mapping'][-1]})" in text
    assert_no_console_error(browser)


# 40-character ids as `minivllm serve` makes them ("cmpl-" + 32 hex digits); the first two share their first
# six hex digits, so their aliases must grow past them to stay apart.
SERVER_IDS = ["cmpl-3f2a9c" + "0" * 26, "cmpl-3f2a9c" + "1" * 26, "chatcmpl-" + "b" * 32, "cmpl-" + "7e" * 16]
SERVER_PROMPTS = ["The capital of France is", "The capital of Spain is", "Write a haiku about the sea.",
                  "def fibonacci(n):"]


@pytest.fixture(scope="module")
def server_ids_tp_run(tiny_llama_folder, tmp_path_factory):
    """A traced run with a server's request ids, cut over 2 tensor-parallel ranks (the tiny Llama: 4 query
    heads, 2 KV heads): (trace JSON as dict, path of its viewer file)."""
    from minivllm import LLM, SamplingParams
    from minivllm.tracing.html import write_html

    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=False, block_size=8, max_model_len=256,
              max_num_seqs=3)
    try:
        engine = llm.llm_engine
        engine.enable_tracing()
        params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
        engine.add_processed_requests([engine.process_inputs(i, p, params) for i, p in zip(SERVER_IDS, SERVER_PROMPTS)])
        while engine.has_unfinished_requests():
            engine.step()
        trace = engine.collect_trace()
        html = tmp_path_factory.mktemp("server-ids-tp") / "trace.html"
        write_html(trace, html, engine.config)
        return json.loads(json.dumps({"info": trace.info, "events": trace.events})), html
    finally:
        llm.shutdown()


@pytest.mark.timeout(300)
def test_server_request_ids_are_drawn_as_short_aliases(server_ids_tp_run, browser):
    """Every chip shows a short alias, the same one for a request everywhere and different for any two, the
    full id on hover; no panel, event or header line spells a 40-character id out."""
    trace, html = server_ids_tp_run
    resize(browser, *SCREENS[0])
    open_viewer(browser, html)
    aliases: dict[str, str] = {}
    for n in range(1, max(steps_of(trace)) + 1):
        page = browser.execute_script("""
            return {chips: [...document.querySelectorAll(".chip")].map((c) => [c.dataset.req, c.title, c.textContent]),
                    text: document.querySelector("header").innerText + document.getElementById("panels").innerText};""")
        for req, title, text in page["chips"]:
            assert req in SERVER_IDS and title == req and len(text) <= 12, (req, text)
            assert aliases.setdefault(req, text) == text  # one alias per request, on every step
        assert not [i for i in SERVER_IDS if i in page["text"]], n
        browser.find_element("id", "next").click()
    assert set(aliases) == set(SERVER_IDS) and len(set(aliases.values())) == len(SERVER_IDS)
    assert aliases[SERVER_IDS[0]] != aliases[SERVER_IDS[1]] and aliases[SERVER_IDS[0]].startswith("3f2a9c")
    assert_no_console_error(browser)


@pytest.mark.timeout(300)
def test_tensor_parallel_ranks_are_in_the_viewer(server_ids_tp_run, browser):
    """What the terminal trace prints under tensor parallelism, per step in the viewer: each rank's shard
    (read off the same recorded answers) and the step's all-reduces and all-gather."""
    trace, html = server_ids_tp_run
    by_step = steps_of(trace)
    n = min(n for n, ev in by_step.items() if "execute" in ev)
    ranks = by_step[n]["execute"]["ranks"]
    assert [r["rank"] for r in ranks] == [0, 1]
    open_viewer(browser, html, step=n)
    rows = browser.execute_script("return [...document.querySelectorAll('#p-ranks tr[data-rank]')]"
                                  ".map((r) => [Number(r.dataset.rank), r.innerText])")
    span = lambda lo_hi: str(lo_hi[0]) if lo_hi[1] - lo_hi[0] == 1 else f"{lo_hi[0]}-{lo_hi[1] - 1}"
    assert [r for r, _ in rows] == [0, 1]
    for (r, text), rank in zip(rows, ranks):
        for piece in (str(rank["pid"]), f"{span(rank['query_heads'])} of {rank['total_num_heads']}",
                      f"{span(rank['kv_heads'])} of {rank['total_num_kv_heads']}",
                      f"units {span(rank['mlp']['units'])} of {rank['mlp']['total_units']}",
                      f"{span(rank['vocab'])} of {rank['vocab_size']}", str(rank["kv_cache_shape"])):
            assert piece in text, (r, piece, text)
    ops = browser.execute_script("return [...document.querySelectorAll('#p-ranks li[data-op]')]"
                                 ".map((li) => [li.dataset.op, li.innerText])")
    assert [op for op, _ in ops] == ["all_reduce"] * len(ranks[0]["all_reduce"]) + ["all_gather"] * len(
        ranks[0]["all_gather"])
    assert all("rank 0 in [" in text and "rank 1 in [" in text for op, text in ops if op == "all_reduce")
    assert f"{ranks[0]['num_all_reduce']} all-reduces this step" in browser.find_element("id", "p-ranks").text
    assert_no_console_error(browser)
