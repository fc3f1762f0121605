"""Failures end cleanly: interrupts, aborts and dead processes lose nothing and leak nothing."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from minivllm import LLM, SamplingParams


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "multiprocess"])
def llm(request, tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=request.param, max_model_len=256, num_gpu_blocks_override=12)
    yield llm
    llm.shutdown()


def all_free(llm) -> bool:
    stats = llm.llm_engine.get_stats()
    return stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1 and stats["num_unfinished"] == 0


def test_interrupted_generate_aborts_its_requests_and_frees_their_blocks(llm, monkeypatch):
    engine = llm.llm_engine
    real_step, calls = engine.step, []

    def step_then_interrupt():
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_step()

    monkeypatch.setattr(engine, "step", step_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(["Once upon a time", "The sea"], SamplingParams(max_tokens=100, ignore_eos=True),
                     use_tqdm=False)
    monkeypatch.undo()
    assert all_free(llm)
    out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=3), use_tqdm=False)  # still usable
    assert len(out[0].outputs[0].token_ids) == 3


def test_abort_frees_blocks_at_once(llm):
    engine = llm.llm_engine
    request_id = engine.add_request(None, "Once upon a time there was", SamplingParams(max_tokens=100))
    engine.step()
    assert engine.get_stats()["num_free_blocks"] < engine.get_stats()["num_gpu_blocks"] - 1
    engine.abort_request([request_id])
    assert all_free(llm) and not engine.has_unfinished_requests()


def test_request_that_can_never_fit_is_refused_not_queued(llm):
    with pytest.raises(ValueError, match="KV blocks"):
        llm.generate(["Once upon a time"], SamplingParams(max_tokens=200), use_tqdm=False)  # 13 blocks > 11
    assert all_free(llm)


SCRIPT = textwrap.dedent("""
    import sys
    from minivllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], max_model_len=256)
    print(llm.llm_engine.info["pid"], flush=True)
    llm.generate(["Once upon a time"] * 4, SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
    llm.generate(["Once upon a time"] * 4, SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
""")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone in all but name
        return f.read().split()[2] != "Z"


@pytest.mark.parametrize("how", ["interrupt", "kill"])
def test_no_engine_core_outlives_its_caller(tiny_llama_folder, how):
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, str(tiny_llama_folder)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "MINIVLLM_LOGGING_LEVEL": "ERROR"})
    child = int(proc.stdout.readline())
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT if how == "interrupt" else signal.SIGKILL)  # Ctrl-C, or no cleanup at all
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child), f"EngineCore pid {child} outlived its caller ({how})"


def test_a_plain_script_without_main_guard_runs_in_multiprocess_mode(tiny_llama_folder, tmp_path):
    """The spawned EngineCore must not re-run the caller's script (no `if __name__ == "__main__"` needed)."""
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        from minivllm import LLM, SamplingParams
        llm = LLM({str(tiny_llama_folder)!r}, max_model_len=256)
        out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=3), use_tqdm=False)
        print("tokens", len(out[0].outputs[0].token_ids))
    """))
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "MINIVLLM_LOGGING_LEVEL": "ERROR"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "tokens 3"
