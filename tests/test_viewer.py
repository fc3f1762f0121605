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

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
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
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        webdriver = None
    if webdriver is None or not CHROMIUM.exists() or not CHROMEDRIVER.exists():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no headless browser for the viewer test under CI: {INSTALL}")
        pytest.skip(f"no headless browser (needs {CHROMIUM}, {CHROMEDRIVER}, selenium): {INSTALL}")
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1600,2300", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(executable_path=str(CHROMEDRIVER)))
    driver.set_page_load_timeout(120)  # bounds a hang only: a busy machine loads a page slowly
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture(scope="module", params=list(RUNS))
def run(request, tmp_path_factory):
    """One traced run of the real engine: (name, trace JSON as dict, path of the --html file)."""
    from minivllm.tracing.cli import add_trace_arguments, run_trace
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
