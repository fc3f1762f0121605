"""`python -m minivllm trace`: deterministic, faithful to its JSON, fitted to its width, and showing chunking and
preemption in full."""
from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys

import pytest

from minivllm import LLM, SamplingParams
from minivllm.__main__ import main
from minivllm.tracing import Trace, make_console, render_trace
from minivllm.entrypoints.cli.trace import NEIGHBOURS, add_trace_arguments, run_trace
from minivllm.tracing.render import clip


def trace_args(tmp_path, name, *extra):
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    return parser.parse_args(["--max-tokens", "8", "--neighbours", "2", "--json", str(tmp_path / name), *extra])


def run_to_text(args, width: int = 80) -> tuple[str, Trace]:
    buffer = io.StringIO()
    trace = run_trace(args, console=make_console(buffer, width=width))
    return buffer.getvalue(), trace


def run_cli(*args, **env) -> str:
    """The CLI in a child process, its stdout a pipe (never a terminal)."""
    out = subprocess.run([sys.executable, "-m", "minivllm", "trace", "--in-process", *args], capture_output=True,
                         text=True, env={**os.environ, **env}, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    return run_to_text(trace_args(tmp, "a.json")), tmp


@pytest.fixture(scope="module")
def small_pool_run(tmp_path_factory):
    """The trace page's preemption example: 6 blocks of 8 tokens, with the default --steps."""
    tmp = tmp_path_factory.mktemp("pool")
    args = trace_args(tmp, "d.json", "--num-blocks", "6", "--block-size", "8", "--neighbours", "3",
                      "--max-tokens", "12", "--in-process")
    text, _ = run_to_text(args)
    return text, Trace.from_json(tmp / "d.json")


def normalise(text: str) -> str:
    """Drop what legitimately differs: where the JSON went and which process EngineCore ran in."""
    text = text.split("trace written to")[0]  # the last thing printed; a long path wraps
    return text.replace("a child process (IPC queues)", "PROCESS").replace("the caller's process", "PROCESS")


def full_step_titles(text: str) -> set[int]:
    return {int(line.split("#")[1].split(":")[0]) for line in text.splitlines() if "EngineCore.step() #" in line}


def test_two_runs_print_identical_output(default_run, tmp_path):
    (text, _), _ = default_run
    again, _ = run_to_text(trace_args(tmp_path, "b.json", "--in-process"))
    assert normalise(again) == normalise(text)


def test_json_trace_loads_back_and_agrees_with_the_printout(default_run, tokenizer):
    (text, trace), tmp = default_run
    loaded = Trace.from_json(tmp / "a.json")
    assert loaded.events == trace.events and loaded.multiprocess
    buffer = io.StringIO()
    render_trace(loaded, make_console(buffer), decode=lambda t: tokenizer.decode([t]))
    assert text.startswith(buffer.getvalue())
    assert "SchedulerOutput (step 1)" in text and "slot_mapping" in text and "block_table[0]" in text
    final = [o for e in loaded.of_kind("outputs") for o in e["outputs"] if o["request_id"] == "0" and o["finished"]]
    assert repr(final[0]["text"]) in " ".join(text.split())  # the traced request's text, whole (wrapped)


def test_tracing_does_not_change_the_tokens(default_run):
    (_, trace), _ = default_run
    traced = {o["request_id"]: o["token_ids"] for e in trace.of_kind("outputs") for o in e["outputs"] if o["finished"]}
    llm = LLM(multiprocess=False, max_num_seqs=3, max_model_len=2048)
    prompts = ["Once upon a time"] + [p for p, _ in NEIGHBOURS[:2]]
    params = [SamplingParams(temperature=0, max_tokens=8)] + [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for _, n in NEIGHBOURS[:2]]
    plain = llm.generate(prompts, params, use_tqdm=False)
    llm.shutdown()
    assert [traced[str(i)] for i in range(3)] == [o.outputs[0].token_ids for o in plain]


def test_quiet_steps_print_one_line_and_eventful_steps_in_full(default_run):
    (text, trace), _ = default_run
    eventful = {e["step"] for e in trace.of_kind("schedule") if e["scheduled_new_reqs"] or e["preempted_req_ids"]
                or any(e["scheduled_cached_reqs"]["resumed_from_preemption"])}
    eventful |= {e["step"] for e in trace.of_kind("update") if any(o["finish_reason"] for o in e["outputs"])}
    assert full_step_titles(text) == eventful
    quiet = [line for line in text.splitlines() if line.startswith("step ")]
    assert len(quiet) == trace.summary()["steps"] - len(eventful)
    # the step after a finish carries finished_req_ids: the runner learns of it one step late
    finish_steps = sorted(e["step"] for e in trace.of_kind("update") if any(o["finish_reason"] for o in e["outputs"]))
    late = [line for line in quiet if line.startswith(f"step {finish_steps[0] + 1:>3}")]
    assert not late or "finished_req_ids=" in late[0]


def test_steps_flag_also_prints_the_first_steps_in_full(default_run, tokenizer):
    (_, trace), _ = default_run
    buffer = io.StringIO()
    render_trace(trace, make_console(buffer), full_steps=3, decode=lambda t: tokenizer.decode([t]))
    assert {1, 2, 3} <= full_step_titles(buffer.getvalue())


def test_small_budget_shows_the_prompt_split_over_steps(tmp_path):
    text, _ = run_to_text(trace_args(tmp_path, "c.json", "--max-num-batched-tokens", "3", "--in-process"))
    loaded = Trace.from_json(tmp_path / "c.json")
    chunks = [e["num_scheduled_tokens"]["0"] for e in loaded.of_kind("schedule")
              if "0" in e["num_scheduled_tokens"]][:2]
    assert chunks == [3, 1]  # "Once upon a time" is 4 tokens: 3 now, 1 next step
    assert loaded.of_kind("execute")[0]["sampled"].get("0") is None  # a partial prefill samples nothing
    assert "0 admitted from WAITING: 3 of 4 prompt tokens (a chunk)" in text
    assert "0 prefill chunk: prompt tokens 3..3 of 4" in text
    assert {1, 2} <= full_step_titles(text)


def test_small_pool_prints_preemption_and_resume_steps_in_full(small_pool_run):
    text, trace = small_pool_run
    preempted = [e for e in trace.of_kind("schedule") if e["preempted_req_ids"]]
    resumed = [e for e in trace.of_kind("schedule") if any(e["scheduled_cached_reqs"]["resumed_from_preemption"])]
    assert preempted and resumed and resumed[0]["step"] > preempted[0]["step"]
    assert {e["step"] for e in preempted + resumed} <= full_step_titles(text)
    for e in preempted:  # the victim prepended: the WAITING order printed is the queue's, head first
        assert f"preempted_req_ids=[{', '.join(e['preempted_req_ids'])}]" in text
        assert f"WAITING (next first) [{', '.join(e['waiting'])}]" in text
        assert e["waiting"][0] in e["preempted_req_ids"]
    victim = preempted[0]["preempted_req_ids"][0]
    assert f"{victim} preempted: blocks freed, num_computed_tokens=0, prepended to WAITING" in text
    assert any(line.startswith(f"| {victim} ") and "| resumed |" in line for line in text.splitlines())
    assert trace.summary()["preemptions"] >= 1


def test_a_resume_says_its_num_computed_tokens_is_a_prefix_cache_hit(small_pool_run):
    """Preemption sets num_computed_tokens to 0; the resume that follows (prefix caching on, vLLM's default)
    finds the request's own full blocks still cached and starts past them: the printout says so."""
    text, trace = small_pool_run
    block_size = trace.info["block_size"]
    resumes = [(e, r, computed) for e in trace.of_kind("schedule") for r, resumed, computed in
               zip(*(e["scheduled_cached_reqs"][k] for k in ("req_ids", "resumed_from_preemption",
                                                             "num_computed_tokens"))) if resumed]
    hits = [(e, r, computed) for e, r, computed in resumes if computed >= block_size]
    assert hits, "the 6-block pool's resume found nothing cached: this test needs a prefix-cache hit on resume"
    flat = " ".join(text.split())  # wrapped lines joined back
    for e, r, computed in hits:
        n = e["num_scheduled_tokens"][r]
        assert (f"{r} resumed from WAITING: its first {computed} tokens are a prefix-cache hit, so it recomputes "
                f"{n} tokens from num_computed_tokens={computed}") in flat
        blocks = e["block_tables"][r][:computed // block_size]
        assert f"{r} prefix-cache hit on resume: blocks [{', '.join(map(str, blocks))}]" in flat
    for e, r, computed in resumes:
        if computed == 0:
            assert f"{r} resumed from WAITING: nothing cached: it recomputes" in flat


def test_width_flag_keeps_every_line_within_80_columns(capsys):
    assert main(["trace", "--in-process", "--width", "80", "--max-tokens", "4", "--neighbours", "2",
                 "--max-num-batched-tokens", "8"]) == 0
    text = capsys.readouterr().out
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "(a chunk)" in text and "EngineCore.step() #2" in text


def test_columns_80_without_a_terminal_keeps_every_line_within_80():
    text = run_cli("--max-tokens", "4", "--neighbours", "2", COLUMNS="80")
    widths = [len(line) for line in text.splitlines()]
    assert max(widths) == 80 and widths[0] == 80  # the first rule spans the width it was given


def test_width_120_output_is_deterministic(tmp_path, tokenizer, capsys):
    assert main(["trace", "--in-process", "--width", "120", "--max-tokens", "4", "--neighbours", "2",
                 "--json", str(tmp_path / "w.json")]) == 0
    text = capsys.readouterr().out
    lines = text.splitlines()
    assert max(map(len, lines)) == 120
    assert "num_computed_tokens" in text  # wide enough to spell out vLLM's field names in the table
    buffer = io.StringIO()
    render_trace(Trace.from_json(tmp_path / "w.json"), make_console(buffer, width=120), focus="0",
                 decode=lambda t: tokenizer.decode([t]))
    assert normalise(text) == normalise(buffer.getvalue())


def test_cut_text_ends_with_an_ellipsis(small_pool_run, tokenizer):
    assert clip(" the cache needs to", 16) == "' the cache'…"
    assert clip("short", 16) == "'short'"
    _, trace = small_pool_run
    buffer = io.StringIO()
    render_trace(trace, make_console(buffer, width=40), decode=lambda t: tokenizer.decode([t]))
    lines = buffer.getvalue().splitlines()
    assert max(map(len, lines)) <= 40
    texts = {o["request_id"]: o["text"] for e in trace.of_kind("outputs") for o in e["outputs"] if o["finished"]}
    shown = [line.split("text=", 1)[1] for line in lines if "text=" in line]
    assert len(shown) == len(texts)
    for printed, full in zip(shown, [texts[o["request_id"]] for e in trace.of_kind("outputs")
                                     for o in e["outputs"] if o["finished"]]):
        if printed != repr(full):  # never cut silently: a cut ends with "'…" and is a prefix of the text
            assert printed.endswith("'…") and repr(full).startswith(printed[:-2])


def test_help_explains_every_option():
    out = subprocess.run([sys.executable, "-m", "minivllm", "trace", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--prompt", "--max-tokens", "--neighbours", "--max-num-batched-tokens", "--num-blocks",
                 "--block-size", "--steps", "--width", "--json", "--model"):
        assert flag in out.stdout
    assert "first N steps in full" in " ".join(out.stdout.split())


def test_bad_option_value_is_a_clear_error(capsys):
    assert main(["trace", "--block-size", "7", "--in-process"]) == 2
    assert "block_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["trace", "--width", "20"])
    assert "too narrow" in capsys.readouterr().err


def test_shared_prefix_shows_the_neighbours_hit_on_the_followed_requests_blocks(tmp_path):
    system = "You are a helpful assistant. Answer every question in one short sentence, plainly and truthfully. "
    text, _ = run_to_text(trace_args(tmp_path, "p.json", "--shared-prefix", system, "--max-tokens", "4",
                                     "--in-process"))
    step1 = Trace.from_json(tmp_path / "p.json").of_kind("schedule")[0]
    new = {n["req_id"]: n for n in step1["scheduled_new_reqs"]}
    assert new["0"]["num_computed_tokens"] == 0  # the followed request computes the prefix ...
    first_block = new["0"]["block_ids"][0]
    flat = " ".join(text.split())  # notes wrap at 80 columns
    for req_id in ("1", "2"):  # ... and its neighbours, admitted after it in the same step, start past it
        assert new[req_id]["num_computed_tokens"] == 16 and new[req_id]["block_ids"][0] == first_block
        assert f"{req_id} admitted from WAITING: " in flat and "after 16 found in the prefix cache" in flat
    assert f"1 prefix-cache hit: blocks [{first_block}] (tokens 0..15), shared with [0, 2]: ref_cnt [3]" in flat
    assert "| 1      | new  |       16 |" in text


def test_speculative_config_prints_drafts_verification_and_rollback(tmp_path):
    """`--speculative-config`: the followed request's verifying steps print in full, each with its rows, drafts,
    accepted count and rollback; the JSON agrees with the printout, and the tokens are those of plain decoding."""
    prompt = "Copy this list exactly: apples, pears, plums, figs, dates, limes. Copy: apples, pears,"
    config = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}'
    text, trace = run_to_text(trace_args(tmp_path, "s.json", "--prompt", prompt, "--max-tokens", "16",
                                         "--neighbours", "1", "--in-process", "--speculative-config", config))
    flat = " ".join(text.split())
    specs = [(e["step"], r, s) for e in trace.of_kind("update") for r, s in e["spec_decode"].items()]
    assert any(s["num_accepted"] == 4 for *_, s in specs) and any(s["num_rejected"] > 0 for *_, s in specs)
    by_step, computed = trace.by_step(), trace.num_computed_tokens()
    for step, req_id, spec in specs:
        sched = by_step[step]["schedule"]
        assert sched["scheduled_spec_decode_tokens"][req_id] == spec["draft_token_ids"]
        assert sched["num_scheduled_tokens"][req_id] == len(spec["draft_token_ids"]) + 1
        after = computed[req_id][step]
        if step + 1 in by_step and req_id in by_step[step + 1]["schedule"]["scheduled_cached_reqs"]["req_ids"]:
            cached = by_step[step + 1]["schedule"]["scheduled_cached_reqs"]
            assert cached["num_computed_tokens"][cached["req_ids"].index(req_id)] == after  # the rollback held
        if req_id == "0":
            d = len(spec["draft_token_ids"])
            assert (f"accepted {spec['num_accepted']} of {d}" in flat
                    and f"rolled back {spec['num_rejected']}: num_computed_tokens {after + spec['num_rejected']} "
                        f"-> {after}" in flat)
            assert step in full_step_titles(text)
    assert "rejection sampler: 0: rows 0..4 verify drafts" in flat
    llm = LLM(multiprocess=False)
    want = llm.generate([prompt], SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0]
    got = [o for e in trace.of_kind("outputs") for o in e["outputs"] if o["request_id"] == "0" and o["finished"]]
    assert got[0]["token_ids"] == want.token_ids
