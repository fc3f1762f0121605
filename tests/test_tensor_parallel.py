"""Tensor parallelism: each rank a process with its shard; greedy tokens as TP=1's; a dead worker never hangs.

SmolLM2-135M (9 heads, 3 KV heads) runs at TP 3; the tiny random Llama (4 heads, 2 KV heads) and OPT models
at TP 2 and 4 (TP 4 copies each of the Llama's 2 KV heads to two ranks). Where float32 summation order
makes a greedy token differ, each differing token must be in the other run's top 5 (vLLM's
check_logprobs_close), and that is reported.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import PROMPTS, check_logprobs_close
from minivllm import LLM, SamplingParams
from minivllm.engine.exceptions import EngineDeadError

MAX_TOKENS, TOP = 24, 5
GREEDY = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)


def greedy_runs(model, **engine_args):
    llm = LLM(model, **engine_args)
    try:
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
        stats = llm.llm_engine.get_stats()
    finally:
        llm.shutdown()
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1, "blocks leaked after the run"
    return [(o.outputs[0].token_ids, [set(step) for step in o.outputs[0].logprobs]) for o in outs]


def assert_same_as_tp1(tp1, tpn, name: str) -> None:
    identical = check_logprobs_close(tp1, tpn, "TP=1", name)
    if identical < len(PROMPTS):
        print(f"{name}: {len(PROMPTS) - identical} of {len(PROMPTS)} prompts differ in a token, each within top {TOP}")
    assert identical >= len(PROMPTS) - 2, f"{name}: only {identical} of {len(PROMPTS)} prompts agree token for token"


@pytest.fixture(scope="module")
def smollm_tp1(smollm_folder):
    return greedy_runs(str(smollm_folder), multiprocess=False)


@pytest.mark.slow
@pytest.mark.parametrize("multiprocess", [False, True], ids=["inproc", "mp"])
def test_smollm_tp3_gives_tp1_tokens(smollm_folder, smollm_tp1, multiprocess):
    assert_same_as_tp1(smollm_tp1, greedy_runs(str(smollm_folder), tensor_parallel_size=3,
                                               multiprocess=multiprocess), "TP=3")


@pytest.mark.parametrize("tp,multiprocess", [(2, False), (4, True)], ids=["tp2-inproc", "tp4-mp"])
def test_tiny_llama_tp_gives_tp1_tokens(tiny_llama_folder, tp, multiprocess):
    tp1 = greedy_runs(str(tiny_llama_folder), multiprocess=False)
    assert_same_as_tp1(tp1, greedy_runs(str(tiny_llama_folder), tensor_parallel_size=tp, multiprocess=multiprocess),
                       f"TP={tp}")


def test_tiny_opt_tp_gives_tp1_tokens(tiny_opt_folder):
    tp1 = greedy_runs(str(tiny_opt_folder), multiprocess=False)
    for tp, multiprocess in ((2, True), (4, False)):
        assert_same_as_tp1(tp1, greedy_runs(str(tiny_opt_folder), tensor_parallel_size=tp,
                                            multiprocess=multiprocess), f"TP={tp}")


def test_each_rank_holds_its_shard_and_the_kv_pool_is_sized_by_the_smallest(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=4, multiprocess=False, num_gpu_blocks_override=64)
    try:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        shards = executor.collective_rpc(describe_shard)
    finally:
        llm.shutdown()
    assert [s["rank"] for s in shards] == [0, 1, 2, 3]
    assert len({s["pid"] for s in shards}) == 4 and os.getpid() not in {s["pid"] for s in shards}
    for s in shards:
        assert s["qkv_proj"] == [(1 + 2 * 1) * 16, 64]  # one query head and one KV head (of 2, copied) per rank
        assert s["gate_up_proj"] == [2 * 128 // 4, 64] and s["down_proj"] == [64, 128 // 4]
        assert s["kv_cache"] == [2, 64, 16, 1, 16]  # [K/V, blocks, block_size, kv heads on this rank, head size]
        assert s["vocab"] == [s["rank"] * 49152 // 4, (s["rank"] + 1) * 49152 // 4]


def describe_shard(worker) -> dict:
    """Run in each worker by collective_rpc (module level: calls are pickled by reference)."""
    model = worker.model_runner.model
    layer = model.model.layers[0]
    return {"rank": worker.rank, "pid": os.getpid(),
            "qkv_proj": [layer.self_attn.qkv_proj.output_size_per_partition, layer.self_attn.qkv_proj.input_size],
            "gate_up_proj": [layer.mlp.gate_up_proj.output_size_per_partition, layer.mlp.gate_up_proj.input_size],
            "down_proj": [layer.mlp.down_proj.output_size, layer.mlp.down_proj.input_size_per_partition],
            "kv_cache": list(worker.model_runner.kv_caches[0].shape),
            "vocab": [model.model.embed_tokens.vocab_start_index, model.model.embed_tokens.vocab_end_index]}


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _wait_gone(pids: list[int], seconds: float = 60) -> list[int]:
    """The pids still alive after waiting for them to go; `seconds` bounds a hang (normally they go at once)."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if _alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.timeout(600)  # bounds a hang: starting 2-3 processes that import torch is slow on a busy machine
@pytest.mark.parametrize("multiprocess", [False, True], ids=["inproc", "mp"])
def test_killing_a_worker_mid_generation_is_engine_dead_error_and_leaves_no_process(tiny_llama_folder, multiprocess):
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=multiprocess, max_model_len=256)
    engine = llm.llm_engine
    if multiprocess:
        engine_core_pid = engine.engine_core.process.pid
        workers = _children(engine_core_pid)
    else:
        engine_core_pid = None
        workers = [w.pid for w in engine.engine_core.engine_core.model_executor.workers]
    assert len(workers) == 2
    for i in range(4):
        engine.add_request(str(i), PROMPTS[i], SamplingParams(max_tokens=200, ignore_eos=True))
    for _ in range(3):
        engine.step()  # the requests are mid-generation
    os.kill(workers[1], signal.SIGKILL)
    with pytest.raises(EngineDeadError, match=r"died|failed"):
        while engine.has_unfinished_requests():
            engine.step()
    with pytest.raises(EngineDeadError):
        engine.step()  # and it stays dead
    llm.shutdown()
    assert _wait_gone(workers + ([engine_core_pid] if engine_core_pid else [])) == []


@pytest.mark.timeout(600)  # bounds a hang (as above)
def test_a_worker_that_dies_while_the_engine_is_idle_ends_the_engine(tiny_llama_folder):
    """EngineCore checks its workers every idle second: the engine ends at once (a server's /health turns 503),
    not at the next request."""
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=True, max_model_len=256)
    core = llm.llm_engine.engine_core.process
    workers = _children(core.pid)
    os.kill(workers[0], signal.SIGKILL)
    core.join(timeout=60)  # bounds a hang: EngineCore checks its workers every idle second
    assert not core.is_alive(), "EngineCore kept running without its rank 0"
    with pytest.raises(EngineDeadError, match="died|failed"):
        llm.generate(["hi"], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.shutdown()
    assert _wait_gone(workers) == []


def test_tensor_parallel_size_must_divide_the_heads(tiny_llama_folder):
    with pytest.raises(ValueError, match=re.escape("Total number of attention heads (4) must be divisible by tensor "
                                                   "parallel size (3).")):
        LLM(str(tiny_llama_folder), tensor_parallel_size=3)
    with pytest.raises(ValueError, match="distributed_executor_backend='uni' runs one worker"):
        LLM(str(tiny_llama_folder), tensor_parallel_size=2, distributed_executor_backend="uni")
    with pytest.raises(ValueError, match="must be a multiple of nnodes=2"):
        LLM(str(tiny_llama_folder), tensor_parallel_size=3, nnodes=2)


TWO_NODES = """
import sys
from minivllm import LLM, SamplingParams
if __name__ == "__main__":
    llm = LLM(sys.argv[1], tensor_parallel_size=4, nnodes=2, node_rank=0, master_port=int(sys.argv[2]))
    outs = llm.generate(sys.argv[3:], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)
    print([o.outputs[0].token_ids for o in outs])
    llm.shutdown()
"""


@pytest.mark.timeout(900)  # bounds a hang: six processes import torch, slow on a busy machine
def test_two_nodes_on_one_machine_give_the_same_tokens(tiny_llama_folder, tmp_path):
    """Ranks 0-1 in one launch (node 0: EngineCore and the driver), ranks 2-3 in a `--headless` launch
    (node 1: workers only), meeting at node 0's TCP store on 127.0.0.1."""
    from minivllm.executor.multiproc_executor import get_open_port
    port, prompts = get_open_port(), PROMPTS[:3]
    env = {**os.environ, "MINIVLLM_LOGGING_LEVEL": "WARNING"}
    headless = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", str(tiny_llama_folder), "--headless",
                                 "--tensor-parallel-size", "4", "--nnodes", "2", "--node-rank", "1",
                                 "--master-addr", "127.0.0.1", "--master-port", str(port)],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        (tmp_path / "node0.py").write_text(TWO_NODES)
        node0 = subprocess.run([sys.executable, str(tmp_path / "node0.py"), str(tiny_llama_folder), str(port),
                                *prompts], env=env, capture_output=True, text=True, timeout=600)
        assert node0.returncode == 0, node0.stdout + node0.stderr
        headless_out, _ = headless.communicate(timeout=120)  # node 1 ends when node 0's driver shuts down
        assert headless.returncode == 0, headless_out
        # the workers end without the interpreter's teardown, whose third-party noise ("nanobind: leaked ...")
        # used to reach the user's terminal at every shutdown
        assert "leaked" not in node0.stderr + headless_out, node0.stderr + headless_out
    finally:
        headless.kill()
        headless.wait()
    llm = LLM(str(tiny_llama_folder), multiprocess=False)
    expected = [o.outputs[0].token_ids for o in llm.generate(
        prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), use_tqdm=False)]
    llm.shutdown()
    assert node0.stdout.strip().splitlines()[-1] == str(expected)


def _worker_pids(pid: int) -> list[int]:
    """Every descendant of `pid` (the server's EngineCore and its workers)."""
    found, todo = [], [pid]
    while todo:
        kids = _children(todo.pop())
        found += kids
        todo += kids
    return found


@pytest.mark.slow
@pytest.mark.timeout(600)  # bounds a hang: a server, EngineCore and 3 workers start inside it
def test_serve_with_tensor_parallel_size_3_answers_the_openai_client(smollm_folder):
    import openai
    from minivllm.executor.multiproc_executor import get_open_port
    port = get_open_port()
    proc = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", "--tensor-parallel-size", "3", "--port",
                             str(port), "--max-model-len", "256", "--uvicorn-log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0, timeout=120)
        while True:  # bounded by the test's timeout; a server that exited fails at once
            assert proc.poll() is None, proc.stdout.read()
            try:
                model = client.models.list().data[0].id
                break
            except openai.APIConnectionError:
                time.sleep(0.2)
        descendants = _worker_pids(proc.pid)
        assert any(len(_children(pid)) == 3 for pid in descendants), descendants  # EngineCore and its 3 workers
        done = client.completions.create(model=model, prompt=PROMPTS[1], max_tokens=8, temperature=0)
        llm = LLM(str(smollm_folder), multiprocess=False, max_model_len=256)
        expected = llm.generate([PROMPTS[1]], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        llm.shutdown()
        assert done.choices[0].text == expected[0].outputs[0].text
        chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert chat.usage.completion_tokens >= 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert _wait_gone(descendants) == []
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_headless_is_for_the_other_nodes():
    out = subprocess.run([sys.executable, "-m", "minivllm", "serve", "--headless", "--tensor-parallel-size", "3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--headless runs the workers of a node after the first" in out.stderr


def _group_overrides(worker) -> list:
    """Run in each worker: the collectives the tracer replaced on this rank's group object (none when detached)."""
    from minivllm.distributed.parallel_state import get_tp_group
    return sorted(k for k in vars(get_tp_group()) if k in ("all_reduce", "all_gather", "gather"))


def test_tracing_attaches_to_the_collectives_from_outside_and_detaches(tiny_llama_folder):
    """The trace's per-rank collectives (named by layer) come from a recorder attached while tracing is on;
    afterwards each rank's group runs its own methods again and the layers carry no hooks."""
    from minivllm.tracing import run_traced
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=False, max_model_len=128)
    try:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        trace = run_traced(llm, [("Once upon a time", SamplingParams(temperature=0, max_tokens=3))])
        ranks = trace.by_step()[1]["execute"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1]
        reduces = ranks[0]["all_reduce"]
        assert [e.get("layer") for e in reduces] == ["model.embed_tokens", "model.layers.0.self_attn.o_proj",
                                                     "model.layers.0.mlp.down_proj"]
        assert ranks[0]["all_gather"][0]["layer"] == "lm_head"
        assert ranks[0]["num_all_reduce"] == 1 + 2 * llm.llm_engine.hf_config.num_hidden_layers
        assert executor.collective_rpc(_group_overrides) == [[], []]
        hooks = executor.collective_rpc(_forward_hooks)
        assert hooks == [0, 0]
    finally:
        llm.shutdown()


def _forward_hooks(worker) -> int:
    return sum(len(m._forward_hooks) for m in worker.model_runner.get_model().modules())
