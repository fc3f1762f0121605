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
    import signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal (see CTRL_C below)
    from minivllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], max_model_len=256)
    engine_step, steps = llm.llm_engine.step, []

    def step():  # after 3 steps, say generate() is under way and wait there for the test's signal (no sleep)
        steps.append(engine_step())
        if len(steps) == 3:
            print(llm.llm_engine.info["pid"], flush=True)
            signal.pause()
        return steps[-1]
    llm.llm_engine.step = step
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
    child = int(proc.stdout.readline())  # printed mid-generate()
    proc.send_signal(signal.SIGINT if how == "interrupt" else signal.SIGKILL)  # Ctrl-C, or no cleanup at all
    proc.wait(timeout=120)  # bounds a hang (a busy machine: several seconds to exit)
    deadline = time.monotonic() + 60  # bounds a hang only: EngineCore notices within its 1 s idle poll
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
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "MINIVLLM_LOGGING_LEVEL": "ERROR"})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "tokens 3"


def _run(script: str, *args: str, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    """Run a script in a fresh interpreter; a hang fails the test through the timeout, never waits forever."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script), *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "MINIVLLM_LOGGING_LEVEL": "ERROR"}, **kw)


KILL_MID_MESSAGE = """
    import os, signal, sys, time
    from minivllm import LLM, SamplingParams
    from minivllm.engine.core_client import EngineDeadError
    llm = LLM(sys.argv[1], max_model_len=64, max_logprobs=-1)
    engine, pid = llm.llm_engine, llm.llm_engine.info["pid"]
    # every output token carries the whole vocabulary's logprobs: a message far larger than the pipe holds
    engine.add_request(None, "Once upon a time", SamplingParams(max_tokens=50, logprobs=-1, ignore_eos=True))
    wchan = f"/proc/{pid}/wchan"
    for _ in range(300):  # until the child sits blocked in a pipe write nobody reads
        time.sleep(0.1)
        if os.path.exists(wchan) and "pipe_w" in open(wchan).read():  # pipe_write, anon_pipe_write, ...
            break
    else:
        time.sleep(3)
    os.kill(pid, signal.SIGKILL)
    try:
        while engine.has_unfinished_requests():
            engine.step()
    except EngineDeadError as e:
        print("dead:", "died unexpectedly" in str(e))
"""


def test_child_killed_while_writing_a_large_message_is_reported_not_waited_on(tiny_llama_folder):
    result = _run(KILL_MID_MESSAGE, str(tiny_llama_folder))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "dead: True"


DEAD_ENGINE_BIG_BATCH = """
    import os, signal, sys
    from minivllm import LLM, SamplingParams
    from minivllm.engine.core_client import EngineDeadError
    llm = LLM(sys.argv[1], max_model_len=512, max_num_seqs=4096)
    os.kill(llm.llm_engine.info["pid"], signal.SIGKILL)
    try:  # megabytes of requests for a queue nobody reads any more
        llm.generate([list(range(10, 400))] * 3000, SamplingParams(max_tokens=1), use_tqdm=False)
    except EngineDeadError:
        print("raised", flush=True)
"""


def test_a_large_batch_to_a_dead_engine_raises_and_the_process_exits(tiny_llama_folder):
    result = _run(DEAD_ENGINE_BIG_BATCH, str(tiny_llama_folder))
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip() == "raised"


CTRL_C = """
    import signal, sys, time
    # Python started with SIGINT ignored (a test runner launched as a background job) never raises
    # KeyboardInterrupt; a terminal's Python has this handler, so give it here as one would have it.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from minivllm import LLM, SamplingParams
    llm = LLM(sys.argv[1], max_model_len=256, num_gpu_blocks_override=64)
    print("ready", llm.llm_engine.info["pid"], flush=True)
    engine_step, steps = llm.llm_engine.step, []

    def step():  # after 10 steps, wait mid-generate() for the Ctrl-C (a timed signal can miss a tiny model's run)
        outputs = engine_step()
        steps.append(1)
        if len(steps) == 10:
            print("stepping", flush=True)
            time.sleep(60)  # the test's timeout fails a Ctrl-C that never comes
        return outputs
    llm.llm_engine.step = step
    try:
        llm.generate(["Once upon a time"] * 4, SamplingParams(max_tokens=240, ignore_eos=True), use_tqdm=False)
        print("not interrupted")
    except KeyboardInterrupt:
        stats = llm.llm_engine.get_stats()
        out = llm.generate(["Once upon a time"], SamplingParams(max_tokens=3), use_tqdm=False)
        print("interrupted", stats["num_unfinished"], stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1,
              len(out[0].outputs[0].token_ids), flush=True)
"""


def test_ctrl_c_in_a_terminal_interrupts_generate_and_the_engine_lives_on(tiny_llama_folder):
    # A terminal's Ctrl-C goes to the whole foreground process group: the caller and EngineCore alike.
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(CTRL_C), str(tiny_llama_folder)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "MINIVLLM_LOGGING_LEVEL": "ERROR"})
    try:
        word, child = proc.stdout.readline().split()
        assert word == "ready"
        assert proc.stdout.readline().strip() == "stepping"  # generate() is under way, waiting between steps
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    assert proc.returncode == 0, err[-2000:]
    assert out.strip() == "interrupted 0 True 3"


@pytest.mark.parametrize("multiprocess", [False, True], ids=["in-process", "multiprocess"])
def test_two_threads_generating_on_one_llm_each_get_their_own_outputs(tiny_llama_folder, multiprocess):
    import threading
    llm = LLM(str(tiny_llama_folder), multiprocess=multiprocess, max_model_len=128, num_gpu_blocks_override=64)
    params = SamplingParams(max_tokens=12, temperature=0)
    prompts = {"a": ["Once upon a time", "The sea"], "b": ["Write a haiku", "1, 2, 3,", "Hello"]}
    alone = {k: [o.outputs[0].token_ids for o in llm.generate(p, params, use_tqdm=False)] for k, p in prompts.items()}
    results, errors = {}, []

    def worker(key):
        try:
            for _ in range(3):
                outs = llm.generate(prompts[key], params, use_tqdm=False)
                results.setdefault(key, []).append([o.outputs[0].token_ids for o in outs])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,), daemon=True) for k in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads), "a generate() call hung"
    assert not errors, errors
    assert results == {k: [v] * 3 for k, v in alone.items()}
    assert all_free(llm)
    llm.shutdown()


def test_engine_core_child_spins_briefly_between_openmp_regions_unless_told(monkeypatch):
    """GOMP_SPINCOUNT reaches the child only (benchmarks/shared_cpu.py: long spins collapse on a shared CPU)."""
    import os
    from minivllm import envs
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    with envs.engine_core_child_environment():
        assert os.environ["GOMP_SPINCOUNT"] == envs.CHILD_GOMP_SPINCOUNT
    assert "GOMP_SPINCOUNT" not in os.environ  # the caller's environment is left as it was
    for name, value in (("OMP_WAIT_POLICY", "ACTIVE"), ("GOMP_SPINCOUNT", "30")):
        monkeypatch.setenv(name, value)
        with envs.engine_core_child_environment():
            assert os.environ[name] == value  # the user's choice wins
            assert os.environ.get("GOMP_SPINCOUNT", value) == value
        monkeypatch.delenv(name)
