"""Speculative decoding by n-gram prompt lookup: proposer, rejection sampler, scheduler rollback, and the engine
giving the same greedy tokens with and without it (chunked, preempted, prefix-cached, with logprobs)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.sched.scheduler import Scheduler
from minivllm.outputs import DraftTokenIds, ModelRunnerOutput
from minivllm.request import Request, RequestStatus
from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.sample.sampler import SamplingMetadata
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.metadata import make_spec_decode_metadata
from minivllm.spec_decode.ngram_proposer import NgramProposer

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


@pytest.mark.parametrize("tokens, min_n, max_n, k, expected", [
    ([1, 2, 3, 4, 2, 3], 2, 3, 4, [4, 2, 3]),  # [2, 3] matched at index 1; three tokens left after it
    ([1, 2, 3, 4, 2, 3], 2, 3, 2, [4, 2]),  # at most k
    ([1, 2, 3, 4, 5, 6], 1, 3, 4, []),  # no suffix occurs earlier
    ([5, 1, 2, 9, 1, 2, 7, 1, 2], 2, 2, 3, [9, 1, 2]),  # the first occurrence, as vLLM
    ([9, 1, 2, 3, 8, 2, 3, 7, 1, 2, 3], 2, 3, 1, [8]),  # the longest n-gram wins over a later shorter one
    ([3, 3], 1, 1, 4, [3]),
    ([3], 1, 2, 4, []),  # too short to match anything
])
def test_ngram_proposer_finds_the_longest_earliest_match(tokens, min_n, max_n, k, expected):
    assert NgramProposer(k, min_n, max_n, max_model_len=100).propose(np.array(tokens)) == expected


def test_ngram_proposer_never_drafts_past_max_model_len():
    assert NgramProposer(4, 1, 2, max_model_len=8).propose(np.array([1, 2, 3, 1, 2, 3])) == [1, 2]  # k 4 cut to 8 - 6


@pytest.mark.parametrize("bad, words", [
    ({"method": "eagle", "num_speculative_tokens": 2}, "'ngram'"),
    ({"method": "ngram"}, "num_speculative_tokens"),
    ({"method": "ngram", "num_speculative_tokens": 0}, "1..32"),
    ({"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 5, "prompt_lookup_max": 3}, "exceed"),
    ({"method": "ngram", "num_speculative_tokens": 2, "draft_model": "x"}, "unknown keys"),
    ({"method": "ngram", "num_speculative_tokens": True}, "an int"),
])
def test_speculative_config_errors_name_the_fix(bad, words):
    with pytest.raises(ValueError, match=words):
        SpeculativeConfig.from_dict(bad)


def test_speculative_config_defaults_as_vllm():
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 3}) == SpeculativeConfig("ngram", 3, 5, 5)
    assert SpeculativeConfig.from_dict({"num_speculative_tokens": 3, "prompt_lookup_max": 4}).prompt_lookup_min == 4


def test_spec_decode_metadata_worked_example():
    md = make_spec_decode_metadata(np.array([3, 4]), [[7, 8], []])
    assert md.logits_indices.tolist() == [0, 1, 2, 3]
    assert md.target_logits_indices.tolist() == [0, 1] and md.bonus_logits_indices.tolist() == [2, 3]


def _md(temperatures, seed=0):
    g = torch.Generator().manual_seed(seed)
    return SamplingMetadata(temperature=torch.tensor(temperatures, dtype=torch.float32),
                            all_greedy=all(t == 0 for t in temperatures), top_k=None, top_p=None, min_p=None,
                            generators=[g] * len(temperatures), max_num_logprobs=None)


def test_greedy_rejection_keeps_the_matching_prefix_then_the_target_token():
    logits = torch.full((5, 10), -5.0)
    for row, best in enumerate([4, 6, 1, 2, 3]):
        logits[row, best] = 5.0
    # request 0: drafts [4, 6, 9]: 4 and 6 kept, 9 replaced by 1; request 1: drafts [2, 3] both kept + bonus 8
    out = RejectionSampler()([[4, 6, 9], [2, 3]], logits, [0, 8], _md([0.0] * 5))
    assert out == [[4, 6, 1], [2, 3, 8]]


def test_random_rejection_sampling_keeps_the_target_distribution():
    """Chi-square on a 5-token vocabulary, fixed seed: the first output token must follow p whatever the draft."""
    p = torch.tensor([0.4, 0.25, 0.2, 0.1, 0.05])
    n = 4000
    logits = p.log().expand(n, 5).clone()
    draft = [[1]] * n  # always propose token 1
    out = RejectionSampler()(draft, logits, [0] * n, _md([1.0] * n, seed=1))
    first = torch.tensor([o[0] for o in out])
    counts = torch.bincount(first, minlength=5).double()
    chi2 = (((counts - n * p) ** 2) / (n * p)).sum().item()
    assert chi2 < 18.47, (counts, chi2)  # df 4, p = 0.001
    accepted = sum(len(o) == 2 for o in out) / n  # kept drafts come with the bonus
    assert abs(accepted - 0.25) < 0.03


def _scheduler(max_model_len=64):
    return Scheduler(SchedulerConfig(max_num_batched_tokens=64, max_model_len=max_model_len),
                     CacheConfig(block_size=4, num_gpu_blocks=32, enable_prefix_caching=True), num_spec_tokens=3)


def _step(sched, generated, spec_next):
    so = sched.schedule()
    ids = list(so.num_scheduled_tokens)
    out = ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [generated[r] for r in ids])
    outputs = sched.update_from_output(so, out)
    sched.update_draft_token_ids(DraftTokenIds(list(spec_next), list(spec_next.values())))  # EngineCore.post_step
    return so, outputs


@pytest.mark.parametrize("eos_at", [None, 0, 1, 3])
def test_scheduler_budgets_drafts_rolls_back_rejected_and_stops_inside_an_accepted_run(eos_at):
    sched = _scheduler()
    req = Request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=20), eos_token_id=2)
    sched.add_request(req)
    _step(sched, {"a": [10]}, {"a": [11, 12, 13]})  # prefill, then 3 drafts for the next step
    assert req.spec_token_ids == [11, 12, 13]
    generated = [11, 12, 99, 3] if eos_at is None else [11, 12, 13, 14]
    if eos_at is not None:
        generated[eos_at] = 2
    else:
        generated = [11, 12, 99]  # two kept, the third replaced
    so, outs = _step(sched, {"a": generated}, {"a": []})
    assert so.num_scheduled_tokens == {"a": 4} and so.scheduled_spec_decode_tokens == {"a": [11, 12, 13]}
    if eos_at is None:
        assert req.num_computed_tokens == 5 + 1 + 2  # prompt, the bonus of step 1, two kept drafts (not the third)
        assert outs.outputs[0].new_token_ids == [11, 12, 99] and req.num_tokens == 9
        assert sched.spec_decoding_stats.num_accepted_tokens_per_pos == [1, 1, 0]
    else:  # EOS inside the run ends the request there; the tokens after it are dropped
        assert outs.outputs[0].new_token_ids == generated[:eos_at + 1]
        assert req.status == RequestStatus.FINISHED_STOPPED and "a" not in sched.requests


def test_scheduler_never_caches_a_block_of_draft_positions():
    sched = _scheduler()
    req = Request("a", [5, 6, 7], SamplingParams(max_tokens=20), eos_token_id=2,
                  block_hasher=__import__("minivllm.core.kv_cache_utils", fromlist=["x"]).get_request_block_hasher(4))
    sched.add_request(req)
    _step(sched, {"a": [10]}, {"a": [11, 12, 13]})  # 4 real tokens: one full block
    _step(sched, {"a": [50]}, {"a": []})  # 3 drafts on positions 4..6 all rejected
    assert sched.kv_cache_manager.num_cached_block["a"] == 1  # the block of positions 4..7 holds no real token yet
    assert req.num_computed_tokens == 4 and req.num_tokens == 5


def test_preemption_drops_drafts():
    sched = _scheduler()
    req = Request("a", [5, 6, 7], SamplingParams(max_tokens=20), eos_token_id=2)
    sched.add_request(req)
    _step(sched, {"a": [10]}, {"a": [11, 12]})
    sched.running.remove(req)
    sched._preempt_request(req)
    assert req.spec_token_ids == [] and req.num_tokens_with_spec == req.num_tokens


PROMPTS = ["Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", "Once upon a time", "a b c d a b c d a b"]


def _generate(folder, params, prompts=PROMPTS, **kwargs):
    llm = LLM(model=str(folder), multiprocess=False, seed=0, **kwargs)
    outs = llm.generate(prompts, params, use_tqdm=False)
    return outs, llm.llm_engine.engine_core.engine_core.scheduler


@pytest.mark.parametrize("kwargs", [
    {},
    {"max_num_batched_tokens": 8, "long_prefill_token_threshold": 5},  # chunked, drafts trimmed by the budget
    {"num_gpu_blocks_override": 12, "block_size": 8},  # preemptions
    {"enable_prefix_caching": False},
], ids=["plain", "chunked", "preempted", "no-prefix-cache"])
def test_greedy_tokens_equal_with_and_without_ngram_speculation(smollm_folder, kwargs):
    """SmolLM2 (a random tiny model never repeats itself, so nothing would be accepted), float32."""
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True, logprobs=2)
    base, _ = _generate(smollm_folder, params, **kwargs)
    spec, sched = _generate(smollm_folder, params, speculative_config=NGRAM, **kwargs)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in base]
    stats = sched.spec_decoding_stats
    assert stats.num_accepted_tokens > 0 and stats.num_draft_tokens > stats.num_accepted_tokens  # both paths ran
    for a, b in zip(base, spec):  # the logprobs of accepted tokens are those of plain decoding
        for da, db in zip(a.outputs[0].logprobs, b.outputs[0].logprobs):
            assert da.keys() == db.keys()
            assert all(abs(da[t].logprob - db[t].logprob) < 1e-3 for t in da)
    if "num_gpu_blocks_override" in kwargs:
        assert sched.num_preemptions > 0


def test_seeded_random_sampling_with_speculation_is_reproducible(tiny_llama_folder):
    params = SamplingParams(temperature=0.8, top_k=20, max_tokens=24, ignore_eos=True, seed=7, n=2)
    a, _ = _generate(tiny_llama_folder, params, speculative_config=NGRAM)
    b, _ = _generate(tiny_llama_folder, params, speculative_config=NGRAM)
    assert [[c.token_ids for c in o.outputs] for o in a] == [[c.token_ids for c in o.outputs] for o in b]
    assert all(len(c.token_ids) == 24 for o in a for c in o.outputs)


def test_speculative_config_reaches_the_engine_as_a_clear_error():
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(speculative_config={"method": "ngram"}, multiprocess=False)


def test_serve_with_speculative_config_flag_and_its_metrics(smollm_folder):
    """`serve --speculative-config JSON`: the EngineCore child process (drafts cross it through post_step in the
    child's busy loop), the openai client, the same greedy text as without speculation, vLLM's spec-decode
    counters on /metrics agreeing with get_stats()."""
    import argparse
    import json
    import re
    import urllib.request

    import openai

    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    from minivllm.entrypoints.openai.cli_args import make_arg_parser
    args = make_arg_parser(argparse.ArgumentParser()).parse_args(
        [str(smollm_folder), "--speculative-config", json.dumps(NGRAM), "--max-model-len", "256"])
    server = ServerThread(AsyncLLM.from_engine_args(EngineArgs.from_cli_args(args)))
    try:
        assert server.engine.engine_core.process.is_alive()
        client = openai.OpenAI(base_url=server.url, api_key="EMPTY", max_retries=0, timeout=120)
        name = client.models.list().data[0].id
        got = [client.completions.create(model=name, prompt=p, max_tokens=24, temperature=0).choices[0].text
               for p in PROMPTS[:2]]
        stats = server.run_coroutine(server.engine.get_stats_async())
        with urllib.request.urlopen(server.url.removesuffix("/v1") + "/metrics", timeout=30) as response:
            text = response.read().decode()
    finally:
        server.stop()
    want, _ = _generate(smollm_folder, SamplingParams(temperature=0, max_tokens=24), PROMPTS[:2])
    assert got == [o.outputs[0].text for o in want]
    assert 0 < stats["spec_decode_num_accepted_tokens"] < stats["spec_decode_num_draft_tokens"]

    def metric(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M))
    for key in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert metric(f"vllm:spec_decode_{key}_total") == stats[f"spec_decode_{key}"]
    per_pos = stats["spec_decode_num_accepted_tokens_per_pos"]
    assert len(per_pos) == 4 and sum(per_pos) == stats["spec_decode_num_accepted_tokens"]
    assert metric("vllm:spec_decode_num_accepted_tokens_per_pos_total") == sum(per_pos)


def test_speculation_under_tensor_parallelism(tiny_llama_folder):
    """TP=2 (worker processes): every rank verifies the same rows and clears its drafts; rank 0's go to the
    scheduler. The tokens are TP=1's without speculation (vLLM's closeness rule for float32 summation order)."""
    from conftest import check_logprobs_close
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=5)

    def run(**kwargs):
        llm = LLM(model=str(tiny_llama_folder), multiprocess=False, **kwargs)
        try:
            outs = llm.generate(PROMPTS, params, use_tqdm=False)
            stats = llm.llm_engine.get_stats()
        finally:
            llm.shutdown()
        return [(o.outputs[0].token_ids, [set(s) for s in o.outputs[0].logprobs]) for o in outs], stats

    plain, _ = run()
    spec, stats = run(tensor_parallel_size=2, speculative_config=NGRAM)
    assert stats["spec_decode_num_draft_tokens"] > 0 and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1
    assert check_logprobs_close(plain, spec, "TP=1", "TP=2 + ngram") >= len(PROMPTS) - 1


COPY = "Copy this list exactly: apples, pears, plums, figs, dates, limes. Copy: apples, pears,"


@pytest.mark.parametrize("stop", [{"stop": ["figs"]}, {"stop": ["figs"], "include_stop_str_in_output": True},
                                  {"stop_token_ids": [38702]}],  # 38702: " figs", the third of the 4 drafts
                         ids=["stop-string", "stop-string-included", "stop-token-id"])
def test_a_stop_inside_an_accepted_run_ends_the_request_there(smollm_folder, stop):
    """Step 2 accepts the 4 drafts 'ums, figs,' and the bonus ' dates' at once; a stop at ' figs', inside that
    run, ends the request exactly where plain decoding ends it, and the two tokens after it are dropped."""
    params = SamplingParams(temperature=0, max_tokens=16, **stop)
    (plain,), _ = _generate(smollm_folder, params, [COPY])
    (spec,), sched = _generate(smollm_folder, params, [COPY], speculative_config=NGRAM)
    assert sched.spec_decoding_stats.num_accepted_tokens >= 4  # the stop fell inside an accepted run
    a, b = plain.outputs[0], spec.outputs[0]
    assert (b.text, b.token_ids, b.finish_reason, b.stop_reason) == (a.text, a.token_ids, a.finish_reason,
                                                                      a.stop_reason)
    assert b.finish_reason == "stop" and b.token_ids[-1] == 38702 and len(b.token_ids) == 4
    assert not sched.requests and sched.kv_cache_manager.block_pool.get_num_free_blocks() == \
        sched.kv_cache_manager.block_pool.num_gpu_blocks - 1
