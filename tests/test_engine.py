"""The public API end to end: both process modes, sampling, stops, bad input, failures."""
from __future__ import annotations

import gc
import os
import signal
import threading

import pytest

from conftest import PROMPTS
from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import EngineDeadError


@pytest.fixture(scope="module")
def tiny_llm(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256, num_gpu_blocks_override=64)
    yield llm
    llm.shutdown()


def run(llm, prompts, params):
    outputs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, o.outputs[0].text, o.outputs[0].finish_reason) for o in outputs]


def test_in_process_and_multiprocess_give_identical_outputs():
    params = [SamplingParams(temperature=0, max_tokens=12), SamplingParams(temperature=0.8, top_p=0.9, seed=3,
                                                                           max_tokens=12)] * 2
    results, pids = [], []
    for multiprocess in (False, True):
        llm = LLM(multiprocess=multiprocess)
        results.append(run(llm, PROMPTS[:4], params))
        stats = llm.llm_engine.get_stats()
        assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1
        pids.append(llm.llm_engine.info["pid"])
        llm.shutdown()
    assert results[0] == results[1]
    assert pids[0] == os.getpid() and pids[1] != os.getpid()  # EngineCore ran in a child the second time
    assert results[0][0][1].startswith(", the city of Nova Haven")  # real text from the real model


def test_generate_returns_outputs_in_input_order(tiny_llm):
    outputs = tiny_llm.generate(["a b c d e f g h", "x"], SamplingParams(temperature=0, max_tokens=3),
                                use_tqdm=False)
    assert [o.prompt for o in outputs] == ["a b c d e f g h", "x"]
    assert all(o.finished and len(o.outputs[0].token_ids) == 3 for o in outputs)
    assert outputs[0].outputs[0].finish_reason == "length"


def test_seeded_sampling_is_independent_of_the_batch(tiny_llm):
    seeded = SamplingParams(temperature=1.0, top_k=50, seed=1234, max_tokens=8)
    alone = run(tiny_llm, ["Once upon a time"], seeded)[0]
    crowd = run(tiny_llm, ["The sea", "Once upon a time", "1 2 3"],
                [SamplingParams(temperature=1.0, max_tokens=8), seeded, SamplingParams(temperature=0.5, max_tokens=8)])
    assert crowd[1] == alone


def test_logprobs_of_sampled_token_and_alternatives(tiny_llm):
    out = tiny_llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=3, logprobs=2),
                            use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == 3
    for token_id, entry in zip(out.token_ids, out.logprobs):
        assert entry[token_id].rank == 1  # greedy: the sampled token is the most likely
        assert len(entry) == 2 and all(lp.logprob <= 0 for lp in entry.values())


def test_stop_string_truncates_text_and_frees_blocks(tiny_llm):
    full = tiny_llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=12),
                             use_tqdm=False)[0].outputs[0]
    stop = full.text[len(full.text) // 2:][:3]
    out = tiny_llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=12, stop=[stop]),
                            use_tqdm=False)[0].outputs[0]
    assert out.finish_reason == "stop" and out.stop_reason == stop
    assert out.text == full.text[:full.text.find(stop)]
    stats = tiny_llm.llm_engine.get_stats()
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1 and stats["num_unfinished"] == 0


def test_stop_token_ids_and_min_tokens(tiny_llm):
    first = tiny_llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)[0]
    token = first.outputs[0].token_ids[1]
    out = tiny_llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, stop_token_ids=[token]),
                            use_tqdm=False)[0].outputs[0]
    assert out.token_ids == first.outputs[0].token_ids[:2] and out.stop_reason == token


def test_chat_applies_the_chat_template():
    llm = LLM(multiprocess=False)
    out = llm.chat([{"role": "user", "content": "What is the capital of France?"}],
                   SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0]
    llm.shutdown()
    assert "Paris" in out.outputs[0].text
    assert out.prompt_token_ids[:2] == llm.get_tokenizer().encode("<|im_start|>system")


@pytest.mark.parametrize("field,value", [
    ("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5), ("top_k", -2), ("min_p", 1.5), ("seed", "x"),
    ("max_tokens", 0), ("min_tokens", -1), ("stop", [""]), ("stop_token_ids", [-1]), ("logprobs", -2),
    ("temperature", float("nan")), ("top_p", float("nan")), ("min_p", float("inf")), ("seed", 2**64),
    ("seed", True), ("max_tokens", True), ("top_k", 2.5), ("ignore_eos", "no"), ("stop_token_ids", [True]),
    ("include_stop_str_in_output", 1), ("skip_special_tokens", None),
])
def test_invalid_sampling_params_name_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})


def test_min_tokens_above_max_tokens_is_refused():
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(min_tokens=5, max_tokens=2)


def test_bad_prompts_are_refused_before_anything_runs(tiny_llm):
    with pytest.raises(ValueError, match="empty"):
        tiny_llm.generate([""], use_tqdm=False)
    with pytest.raises(ValueError, match="max_model_len"):
        tiny_llm.generate([[5] * 300], use_tqdm=False)
    with pytest.raises(ValueError, match="one per prompt"):
        tiny_llm.generate(["a", "b"], [SamplingParams()] * 3, use_tqdm=False)
    with pytest.raises(ValueError, match="token ids"):
        tiny_llm.generate([[10**9]], use_tqdm=False)
    assert tiny_llm.llm_engine.get_stats()["num_unfinished"] == 0


def test_unknown_model_and_bad_engine_args():
    with pytest.raises(ValueError, match="Unknown model"):
        LLM("/no/such/model-folder", multiprocess=False)
    with pytest.raises(ValueError, match="block_size"):
        LLM(block_size=7, multiprocess=False)
    with pytest.raises(ValueError, match="Unknown engine argument"):
        LLM(not_an_arg=1, multiprocess=False)


def test_unsupported_architecture_is_named(tmp_path):
    from transformers import GPT2Config
    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="gpt2"):
        LLM(str(tmp_path), multiprocess=False)


def test_killed_engine_core_raises_instead_of_hanging(tiny_llama_folder):
    """The caller notices a dead child (its output pipe's EOF, is_alive) rather than waiting for outputs. The
    60 s join only bounds a hang: a passing run raises well within a second, and ends the wait at once."""
    llm = LLM(str(tiny_llama_folder), multiprocess=True, max_model_len=256)
    pid = llm.llm_engine.info["pid"]
    os.kill(pid, signal.SIGKILL)
    outcome = []

    def generate():
        try:
            llm.generate(["Once upon a time"], SamplingParams(max_tokens=50), use_tqdm=False)
            outcome.append("returned")
        except Exception as e:  # noqa: BLE001 - checked below
            outcome.append(e)
    caller = threading.Thread(target=generate, daemon=True)
    caller.start()
    caller.join(timeout=60)
    assert outcome, "generate() kept waiting on a dead EngineCore"
    assert isinstance(outcome[0], EngineDeadError) and "died" in str(outcome[0]), outcome
    llm.shutdown()


def test_shutdown_leaves_no_child(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=True, max_model_len=256)
    process = llm.llm_engine.engine_core.process
    llm.generate(["hi there"], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.shutdown()
    assert not process.is_alive()


def test_start_up_freezes_the_heap_and_shutdown_hands_it_back(tiny_llama_folder):
    """As vLLM's EngineCore: what start-up built leaves the collector's full passes (gc.freeze, utils/gc_utils.py)
    until shutdown; start-up runs with the collector paused and leaves it as the caller had it."""
    kw = dict(multiprocess=False, max_model_len=128)
    gc.unfreeze()
    llm = LLM(str(tiny_llama_folder), **kw)
    assert gc.get_freeze_count() > 0 and gc.isenabled()
    assert llm.generate(PROMPTS[:1], SamplingParams(max_tokens=3))[0].outputs[0].token_ids
    llm.shutdown()
    assert gc.get_freeze_count() == 0
    gc.disable()
    try:
        with LLM(str(tiny_llama_folder), **kw):
            assert not gc.isenabled()
    finally:
        gc.enable()


def test_hub_id_already_in_the_local_hf_cache_loads(tiny_llama_folder, tmp_path, monkeypatch):
    """A hub id resolves through the local HF cache only; nothing is downloaded."""
    import shutil
    snapshot = tmp_path / "models--acme--tiny-llama" / "snapshots" / "0123456789abcdef"
    shutil.copytree(tiny_llama_folder, snapshot)
    (tmp_path / "models--acme--tiny-llama" / "refs").mkdir()
    (tmp_path / "models--acme--tiny-llama" / "refs" / "main").write_text("0123456789abcdef")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path))
    from minivllm.models.loader import resolve_model
    assert resolve_model("acme/tiny-llama") == snapshot
    with pytest.raises(ValueError, match="Unknown model"):
        resolve_model("acme/not-cached")


def test_engine_core_log_lines_carry_the_child_pid(tiny_llama_folder, tmp_path):
    """Every line the child logs, the CPU-kernel build included, reads "(EngineCore pid=N) LEVEL minivllm: ..."."""
    import subprocess
    import sys
    script = ("import sys\nfrom minivllm import LLM\n"
              "llm = LLM(sys.argv[1], max_model_len=64)\nprint(llm.llm_engine.info['pid'])\nllm.shutdown()\n")
    env = {**os.environ, "MINIVLLM_LOGGING_LEVEL": "INFO", "MINIVLLM_CACHE_DIR": str(tmp_path)}  # forces a build
    result = subprocess.run([sys.executable, "-c", script, str(tiny_llama_folder)], capture_output=True, text=True,
                            timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    pid = int(result.stdout.split()[-1])
    lines = [line for line in result.stderr.splitlines() if "minivllm:" in line]
    child = [line for line in lines if line.startswith(f"(EngineCore pid={pid}) INFO minivllm: ")]
    assert any("compiled CPU kernels" in line for line in child), lines
    assert any("EngineCore ready" in line for line in child), lines
    assert all(line.startswith(("(EngineCore pid=", "INFO minivllm: ", "WARNING minivllm: ")) for line in lines), lines


def test_engine_core_drives_a_uniproc_executor_whose_worker_holds_the_model_and_the_kv_cache(tiny_llm):
    from minivllm.executor.uniproc_executor import UniProcExecutor
    from minivllm.worker.gpu_model_runner import GPUModelRunner
    from minivllm.worker.gpu_worker import Worker
    core = tiny_llm.llm_engine.engine_core.engine_core
    executor = core.model_executor
    assert type(executor) is UniProcExecutor
    worker = executor.driver_worker
    assert type(worker) is Worker and type(worker.model_runner) is GPUModelRunner
    # the pool EngineCore sized (num_gpu_blocks_override=64) is what the worker allocated, in every layer
    assert core.num_gpu_blocks == 64 == core.scheduler.kv_cache_manager.block_pool.num_gpu_blocks
    assert {kv.shape[1] for kv in worker.model_runner.kv_caches} == {64}
    assert executor.collective_rpc("get_model") == [worker.model_runner.get_model()]
    assert executor.collective_rpc(lambda w, x: (w.rank, x), args=(7,)) == [(0, 7)]
    executor.check_health()
    calls = []
    real = worker.execute_model
    worker.execute_model = lambda so: (calls.append(so.total_num_scheduled_tokens), real(so))[1]
    try:
        run(tiny_llm, ["Once upon a time"], SamplingParams(temperature=0, max_tokens=3))
    finally:
        del worker.execute_model
    assert len(calls) == 3 and calls[0] > 1 and calls[1:] == [1, 1]  # the prefill, then one token per decode


def test_kv_cache_is_sized_from_what_the_workers_report(tiny_llama_folder, monkeypatch):
    """As vLLM's _initialize_kv_caches: the smallest worker's free memory sizes the one pool every worker holds."""
    from minivllm.config import EngineConfig
    from minivllm.core.kv_cache_utils import kv_cache_bytes_per_block
    from minivllm.engine.core import EngineCore
    from minivllm.executor.uniproc_executor import UniProcExecutor
    from minivllm.models.loader import load_config
    per_block = kv_cache_bytes_per_block(load_config(tiny_llama_folder), 16, 4)
    monkeypatch.setattr(UniProcExecutor, "determine_available_memory", lambda self: [per_block * 40, per_block * 9])
    core = EngineCore(EngineConfig(model=str(tiny_llama_folder), max_model_len=128), str(tiny_llama_folder))
    assert core.num_gpu_blocks == 9 == core.model_executor.driver_worker.model_runner.kv_caches[0].shape[1]


def test_tracing_reads_each_steps_batch_from_the_workers_and_leaves_the_step_alone(tiny_llm):
    """The tracer is a scheduler observer; each step's packed batch is recorded in the worker as the step runs
    (attached by one collective_rpc when tracing starts, detached by one when it stops); the in-process worker's
    records are read directly, so the steps themselves make no extra call."""
    from minivllm.tracing import run_traced
    from minivllm.tracing.tracer import set_step_recording
    core = tiny_llm.llm_engine.engine_core.engine_core
    executor, rpcs = core.model_executor, []
    real = executor.collective_rpc
    executor.collective_rpc = lambda method, *a, **k: (rpcs.append(method), real(method, *a, **k))[1]
    try:
        trace = run_traced(tiny_llm, [("Once upon a time", SamplingParams(temperature=0, max_tokens=3))])
        attached = list(core.scheduler.observers)
    finally:
        del executor.collective_rpc
        core.scheduler.observers.clear()
        tiny_llm.llm_engine.tracer = None
    executes = trace.of_kind("execute")
    assert rpcs == [set_step_recording] + ["execute_model"] * 3 + [set_step_recording] and len(executes) == 3
    assert "execute_model" not in vars(core.model_executor.driver_worker.model_runner)  # detached
    assert attached == [] and core.tracer is None  # run_traced detached it again
    assert executes[0]["batch"]["positions"] == list(range(len(executes[0]["batch"]["input_ids"])))
    assert [e["batch"]["positions"] for e in executes[1:]] == [[executes[0]["batch"]["positions"][-1] + i]
                                                               for i in (1, 2)]


def test_the_token_budget_defaults_to_vllms_llm_class_defaults(tiny_llama_folder):
    """vLLM's EngineArgs.get_batch_defaults for its LLM class: 4096 per rank on a CPU, 8192 on a GPU; a budget
    given is kept; without chunked prefill and no budget a whole prompt must fit a step: max(max_model_len, default)."""
    from minivllm.config import EngineConfig, batch_default
    from minivllm.engine.core import EngineCore
    assert EngineConfig().max_num_batched_tokens == 4096 == batch_default("cpu", 1)
    assert EngineConfig(tensor_parallel_size=3).max_num_batched_tokens == 3 * 4096
    assert batch_default("cuda", 2) == 8192
    assert EngineConfig(max_num_batched_tokens=8192).max_num_batched_tokens == 8192
    off = EngineConfig(enable_chunked_prefill=False)
    assert off.scheduler_config(max_model_len=8192).max_num_batched_tokens == 8192
    assert off.scheduler_config(max_model_len=128).max_num_batched_tokens == 4096
    core = EngineCore(EngineConfig(model=str(tiny_llama_folder), max_model_len=128), str(tiny_llama_folder))
    assert core.scheduler.scheduler_config.max_num_batched_tokens == 4096 == core.info()["max_num_batched_tokens"]


def test_the_viewer_shows_the_budget_enginecore_resolved(tiny_llama_folder):
    """Chunked prefill off and no budget given: the config keeps None, EngineCore resolves max(max_model_len,
    4096); the trace viewer's budget panel gets that number from the engine's info, not the None."""
    import json
    from minivllm.config import EngineConfig
    from minivllm.engine.core import EngineCore
    from minivllm.tracing.html import render_html
    from minivllm.tracing.trace import Trace
    config = EngineConfig(model=str(tiny_llama_folder), max_model_len=128, enable_chunked_prefill=False)
    core = EngineCore(config, str(tiny_llama_folder))
    assert config.max_num_batched_tokens is None and core.info()["max_num_batched_tokens"] == 4096
    page = render_html(Trace(core.info()), config)
    start = page.index('type="application/json">') + len('type="application/json">')
    assert json.loads(page[start:page.index("</script>", start)])["config"]["max_num_batched_tokens"] == 4096
