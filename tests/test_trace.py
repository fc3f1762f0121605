"""`python -m minivllm trace`: deterministic, faithful to its JSON, and showing chunking and preemption."""
from __future__ import annotations

import io
import subprocess
import sys

import pytest

from minivllm import LLM, SamplingParams
from minivllm.__main__ import main
from minivllm.tracing import Trace, make_console, render_trace
from minivllm.tracing.cli import NEIGHBOURS, run_trace


def trace_args(tmp_path, name, *extra):
    from minivllm.tracing.cli import add_trace_arguments
    import argparse
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    return parser.parse_args(["--max-tokens", "8", "--neighbours", "2", "--json", str(tmp_path / name), *extra])


def run_to_text(args) -> tuple[str, Trace]:
    buffer = io.StringIO()
    trace = run_trace(args, console=make_console(buffer))
    return buffer.getvalue(), trace


@pytest.fixture(scope="module")
def default_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("trace")
    return run_to_text(trace_args(tmp, "a.json")), tmp


def normalise(text: str) -> str:
    """Drop what legitimately differs: where the JSON went and which process EngineCore ran in."""
    lines = [line for line in text.splitlines() if not line.startswith("trace written to")]
    return "\n".join(lines).replace("a child process (IPC queues)", "PROCESS").replace("the caller's process", "PROCESS")


def test_two_runs_print_identical_output(default_run, tmp_path):
    (text, _), _ = default_run
    again, _ = run_to_text(trace_args(tmp_path, "b.json", "--in-process"))
    assert normalise(again) == normalise(text)


def test_json_trace_loads_back_and_agrees_with_the_printout(default_run):
    (text, trace), tmp = default_run
    loaded = Trace.from_json(tmp / "a.json")
    assert loaded.events == trace.events and loaded.multiprocess
    buffer = io.StringIO()
    from transformers import AutoTokenizer
    from minivllm.models.loader import resolve_model
    tokenizer = AutoTokenizer.from_pretrained(resolve_model(None))
    render_trace(loaded, make_console(buffer), full_steps=3, decode=lambda t: tokenizer.decode([t]))
    assert text.startswith(buffer.getvalue())
    assert "SchedulerOutput (step 1)" in text and "slot_mapping" in text and "block_table[0]" in text
    final = [o for e in loaded.of_kind("outputs") for o in e["outputs"] if o["request_id"] == "0" and o["finished"]]
    assert f"text: {final[0]['text']!r}" in text


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


def test_small_budget_shows_the_prompt_split_over_steps(tmp_path):
    _, trace = run_to_text(trace_args(tmp_path, "c.json", "--max-num-batched-tokens", "3", "--in-process"))
    loaded = Trace.from_json(tmp_path / "c.json")
    chunks = [e["num_scheduled_tokens"]["0"] for e in loaded.of_kind("schedule")
              if "0" in e["num_scheduled_tokens"]][:2]
    assert chunks == [3, 1]  # "Once upon a time" is 4 tokens: 3 now, 1 next step
    assert loaded.of_kind("execute")[0]["sampled"].get("0") is None  # a partial prefill samples nothing


def test_small_pool_shows_preemption_and_recompute(tmp_path):
    text, _ = run_to_text(trace_args(tmp_path, "d.json", "--num-blocks", "4", "--block-size", "8",
                                     "--in-process", "--max-tokens", "12"))
    loaded = Trace.from_json(tmp_path / "d.json")
    preempted = [e for e in loaded.of_kind("schedule") if e["preempted_req_ids"]]
    assert preempted, "a 3-block pool must preempt"
    resumed = [e for e in loaded.of_kind("schedule") if any(e["scheduled_cached_reqs"]["resumed_from_preemption"])]
    assert resumed and resumed[0]["step"] > preempted[0]["step"]
    assert "PREEMPTED" in text or "resumed" in text
    assert loaded.summary()["preemptions"] >= 1


def test_help_explains_every_option():
    out = subprocess.run([sys.executable, "-m", "minivllm", "trace", "--help"], capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--prompt", "--max-tokens", "--neighbours", "--max-num-batched-tokens", "--num-blocks",
                 "--block-size", "--steps", "--json", "--model"):
        assert flag in out.stdout


def test_bad_option_value_is_a_clear_error(capsys):
    assert main(["trace", "--block-size", "7", "--in-process"]) == 2
    assert "block_size" in capsys.readouterr().err
