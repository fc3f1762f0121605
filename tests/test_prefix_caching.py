"""Prefix caching as vLLM V1 does it: chained block hashes, shared blocks, lazy eviction.

First the scheduler alone, driven by hand on the issue's numbers (block_size 16, a 55-token prompt), then
the real engine: greedy tokens with caching on equal caching off and HF transformers, with prompts that
share prefixes, chunked, preempted or both, on every attention backend; n > 1 children share their prompt.
"""
from __future__ import annotations

import os
import random

os.environ.setdefault("TRITON_INTERPRET", "1")  # before anything imports triton, as in test_triton_backend.py

import pytest  # noqa: E402

from conftest import hf_greedy  # noqa: E402
from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.config import CacheConfig, SchedulerConfig  # noqa: E402
from minivllm.core.kv_cache_utils import NONE_HASH, get_request_block_hasher, hash_block_tokens  # noqa: E402
from minivllm.core.sched.scheduler import Scheduler  # noqa: E402
from minivllm.engine.arg_utils import EngineArgs  # noqa: E402
from minivllm.engine.llm_engine import LLMEngine  # noqa: E402
from minivllm.outputs import ModelRunnerOutput  # noqa: E402
from minivllm.request import Request  # noqa: E402

EOS = 2
PROMPT = random.Random(0).sample(range(100, 1000), 200)  # 200 distinct token ids: no accidental hits


def make_scheduler(num_blocks=1024, block_size=16, budget=8192, caching=True, policy="fcfs", threshold=0):
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, policy=policy,
                                     long_prefill_token_threshold=threshold),
                     CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks, enable_prefix_caching=caching))


def make_request(s, req_id, token_ids, max_tokens=4, priority=0, arrival=0.0, **params):
    hasher = get_request_block_hasher(s.cache_config.block_size)  # what EngineCore gives each request
    return Request(req_id, list(token_ids), SamplingParams(temperature=0, max_tokens=max_tokens, **params), EOS,
                   priority=priority, arrival_time=arrival, block_hasher=hasher)


def step(s, token=5):
    """schedule(), then play the model: one token for each request that caught up with its last token."""
    so = s.schedule()
    ids = list(so.num_scheduled_tokens)
    sampled = [[token] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in ids]
    return so, s.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))


def drain(s):
    while s.has_unfinished_requests():
        step(s)


def pool_of(s):
    return s.kv_cache_manager.block_pool


def test_block_hashes_chain_parent_and_tokens_and_grow_with_full_blocks_only():
    s = make_scheduler()
    r = make_request(s, "A", PROMPT[:55])
    h0 = hash_block_tokens(None, PROMPT[:16])
    assert h0 == hash_block_tokens(NONE_HASH, PROMPT[:16]) and len(h0) == 32  # sha256
    assert r.block_hashes == [h0, hash_block_tokens(h0, PROMPT[16:32]),
                              hash_block_tokens(r.block_hashes[1], PROMPT[32:48])]  # 55 tokens: 3 full blocks
    assert hash_block_tokens(h0, PROMPT[:16]) != h0  # the same tokens one block later: another hash
    for _ in range(8):
        r.append_output_token_ids(5)
    assert len(r.block_hashes) == 3  # 63 tokens
    r.append_output_token_ids([5])
    assert r.block_hashes[3] == hash_block_tokens(r.block_hashes[2], PROMPT[48:55] + [5] * 9)


def test_a_48_token_shared_prefix_is_computed_once_and_its_blocks_are_shared():
    s = make_scheduler()
    s.add_request(make_request(s, "A", PROMPT[:55]))
    step(s)
    assert s.kv_cache_manager.get_block_ids("A") == [1, 2, 3, 4]
    s.add_request(make_request(s, "B", PROMPT[:48] + [7] * 12))  # 60 tokens, the first 48 the same
    so, _ = step(s)
    new_b = so.scheduled_new_reqs[0]
    assert new_b.req_id == "B" and new_b.num_computed_tokens == 48 and new_b.block_ids == [1, 2, 3, 5]
    assert so.num_scheduled_tokens == {"A": 1, "B": 12}  # B runs only its own 12 tokens
    assert [b.ref_cnt for b in pool_of(s).blocks[1:6]] == [2, 2, 2, 1, 1]
    assert s.kv_cache_manager.prefix_cache_stats.hits == 48
    drain(s)
    pool = pool_of(s)
    assert pool.get_num_free_blocks() == 1023 and all(b.ref_cnt == 0 for b in pool.blocks[1:])
    s.add_request(make_request(s, "C", PROMPT[:50]))  # freed, still cached: blocks 1-3 hit again
    so, _ = step(s)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 48 and so.scheduled_new_reqs[0].block_ids[:3] == [1, 2, 3]
    assert so.num_scheduled_tokens == {"C": 2}


def test_an_identical_64_token_prompt_hits_48_tokens_never_64():
    s = make_scheduler()
    s.add_request(make_request(s, "A", PROMPT[:64]))
    drain(s)
    s.add_request(make_request(s, "B", PROMPT[:64]))
    so, out = step(s)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 48  # (64 - 1) // 16 blocks: the last one recomputed
    assert so.num_scheduled_tokens == {"B": 16}
    assert out.outputs[0].num_cached_tokens == 48 and out.outputs[0].new_token_ids == [5]


def test_a_request_admitted_in_the_same_step_hits_blocks_cached_at_allocation():
    s = make_scheduler()
    for rid in ("A", "B"):
        s.add_request(make_request(s, rid, PROMPT[:40]))
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"A": 40, "B": 8}  # B: 32 tokens from A's blocks, written this very step
    assert [r.block_ids for r in so.scheduled_new_reqs] == [[1, 2, 3], [1, 2, 4]]
    drain(s)
    assert pool_of(s).get_num_free_blocks() == 1023


def test_duplicate_blocks_for_one_hash_are_evicted_one_by_one_without_a_leak_or_double_free():
    # Chunks of 6 at block_size 4: B joins after A's first chunk, hits A's block 0, then both compute
    # block 1 of the same prompt side by side: two physical blocks under one hash.
    s = make_scheduler(num_blocks=9, block_size=4, threshold=6)
    s.add_request(make_request(s, "A", PROMPT[:16], max_tokens=1))
    s.add_request(make_request(s, "B", PROMPT[:16], max_tokens=1))
    step(s)
    step(s)
    pool = pool_of(s)
    h1 = s.requests["A"].block_hashes[1]
    assert sorted(pool.cached_block_hash_to_block[h1]) == [2, 3]  # A's block 2 and B's block 3
    drain(s)
    assert pool.get_num_free_blocks() == 8 and all(b.ref_cnt == 0 for b in pool.blocks[1:])
    c = make_request(s, "C", PROMPT[100:132], max_tokens=1)
    s.add_request(c)  # 8 new blocks: every cached block is evicted, duplicates one by one
    drain(s)
    assert pool.cached_block_hash_to_block.keys() == set(c.block_hashes)
    assert all(len(same) == 1 for same in pool.cached_block_hash_to_block.values())
    free = pool.free_block_queue.get_all_free_blocks()
    assert pool.get_num_free_blocks() == len({b.block_id for b in free}) == len(free) == 8  # no double free


def test_lazy_eviction_reuses_the_freed_tail_first_and_drops_its_hash():
    s = make_scheduler(num_blocks=6, block_size=4)  # 5 usable blocks
    s.add_request(make_request(s, "A", PROMPT[:13], max_tokens=1))  # blocks 1-4, three of them full
    drain(s)
    pool = pool_of(s)
    assert [b.block_id for b in pool.free_block_queue.get_all_free_blocks()] == [5, 4, 3, 2, 1]  # tail first
    assert len(pool.cached_block_hash_to_block) == 3  # blocks 1-3 keep their hashes while free
    a_hashes = make_request(s, "A'", PROMPT[:13]).block_hashes
    b = make_request(s, "B", PROMPT[100:112], max_tokens=1)
    s.add_request(b)  # needs 3 blocks: pops 5, 4 and 3, and only then does block 3 lose A's hash
    so, _ = step(s)
    assert so.scheduled_new_reqs[0].block_ids == [5, 4, 3]
    assert a_hashes[2] not in pool.cached_block_hash_to_block and a_hashes[1] in pool.cached_block_hash_to_block
    assert pool.blocks[3].block_hash == b.block_hashes[2]  # block 3 now holds B's third block
    drain(s)
    s.add_request(make_request(s, "C", PROMPT[:13], max_tokens=1))  # A's prompt again: only blocks 1-2 left
    so, _ = step(s)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 8 and so.scheduled_new_reqs[0].block_ids[:2] == [1, 2]


def test_touch_revives_a_free_cached_block():
    s = make_scheduler(num_blocks=6, block_size=4)
    s.add_request(make_request(s, "A", PROMPT[:9], max_tokens=1))
    drain(s)
    pool = pool_of(s)
    s.add_request(make_request(s, "B", PROMPT[:9], max_tokens=3))
    step(s)
    assert pool.blocks[1].ref_cnt == 1 and pool.blocks[2].ref_cnt == 1
    assert 1 not in [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]


def test_a_preempted_request_hits_its_own_freed_blocks_when_it_resumes():
    s = make_scheduler(num_blocks=7, block_size=4)  # 6 usable blocks
    s.add_request(make_request(s, "A", PROMPT[:8], max_tokens=12))
    s.add_request(make_request(s, "B", PROMPT[50:62], max_tokens=2))
    step(s)  # A: blocks 1-2, B: blocks 3-5
    s.add_request(make_request(s, "C", PROMPT[100:103], max_tokens=1))
    seen = []
    while "C" not in seen and s.has_unfinished_requests():
        so, _ = step(s)
        seen += [r.req_id for r in so.scheduled_new_reqs]
        for i, rid in enumerate(so.scheduled_cached_reqs.req_ids):
            if so.scheduled_cached_reqs.resumed_from_preemption[i]:
                resumed = (rid, so.scheduled_cached_reqs.num_computed_tokens[i])
    assert s.num_preemptions > 0
    rid, hit = resumed
    assert hit > 0 and hit % 4 == 0  # readmitted at the end of its own still-cached blocks
    stats = s.kv_cache_manager.prefix_cache_stats
    assert stats.preempted_requests > 0 and stats.preempted_hits >= hit
    drain(s)


def test_a_priority_victim_planned_this_step_uncaches_the_blocks_it_never_wrote():
    s = make_scheduler(num_blocks=9, block_size=4, policy="priority", threshold=8)  # 8 usable blocks
    s.add_request(make_request(s, "low", PROMPT[:24], max_tokens=2, priority=5, arrival=0))
    step(s)  # low: 8 tokens, blocks 1-2
    s.add_request(make_request(s, "high", PROMPT[100:112], max_tokens=2, priority=0, arrival=1))
    step(s)  # low: blocks 3-4, high: blocks 5-6
    so, _ = step(s)  # low takes 7-8 (cached for tokens 16-23), then high needs one: low, already planned, goes
    assert so.preempted_req_ids == {"low"} and list(so.num_scheduled_tokens) == ["high"]
    pool = pool_of(s)
    assert all(pool.blocks[i].block_hash is not None for i in (1, 2, 3, 4))  # written in earlier steps
    assert pool.blocks[7].block_hash is None  # never written: out of the cache, or a hit would read garbage
    drain(s)
    assert s.kv_cache_manager.prefix_cache_stats.preempted_hits == 16  # low resumed at its 4 written blocks


def test_prompt_logprobs_skip_reading_the_cache_but_still_fill_it():
    s = make_scheduler()
    s.add_request(make_request(s, "A", PROMPT[:40]))
    drain(s)
    s.add_request(make_request(s, "B", PROMPT[:40], prompt_logprobs=1))
    so, out = step(s)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0 and so.num_scheduled_tokens == {"B": 40}
    assert out.outputs[0].num_cached_tokens == 0
    assert s.kv_cache_manager.prefix_cache_stats.requests == 1  # B's skipped lookup is not counted


def test_with_caching_off_nothing_is_hashed_or_hit():
    s = make_scheduler(caching=False)
    for rid in ("A", "B"):
        s.add_request(make_request(s, rid, PROMPT[:40]))
    so, _ = step(s)
    assert so.num_scheduled_tokens == {"A": 40, "B": 40}
    assert not pool_of(s).cached_block_hash_to_block and all(b.block_hash is None for b in pool_of(s).blocks)


def test_reset_prefix_cache_is_refused_while_requests_run():
    s = make_scheduler()
    s.add_request(make_request(s, "A", PROMPT[:40]))
    step(s)
    assert s.reset_prefix_cache() is False and pool_of(s).cached_block_hash_to_block
    drain(s)
    assert s.reset_prefix_cache() is True and not pool_of(s).cached_block_hash_to_block
    assert s.kv_cache_manager.prefix_cache_stats.queries == 0
    s.add_request(make_request(s, "B", PROMPT[:40]))
    so, _ = step(s)
    assert so.scheduled_new_reqs[0].num_computed_tokens == 0


# The real engine. SmolLM2's tokenizer makes PREFIX + suffix share 37 tokens (two blocks of 16 and a bit), and
# one prompt comes again whole: 32-token hits, some within one step, some across generate() calls.
PREFIX = ("You are a careful assistant who answers questions about the world. Answer in one short sentence, never "
          "repeat the question back, and add no greeting or explanation of any kind.\nQuestion: ")
SUFFIXES = ["What is the capital of France?", "Name a prime number.", "What colour is the sky?",
            "What is the capital of France?", "Who wrote Hamlet? Answer with the name only."]
MAX_TOKENS = 12


@pytest.fixture(scope="module")
def shared_prompts(tokenizer):
    ids = [tokenizer.encode(PREFIX + s) for s in SUFFIXES]
    assert min(len(p) for p in ids) > 32 and ids[0] == ids[3]
    return ids


def run_engine(folder, prompts, **engine_args):
    llm = LLM(str(folder) if folder else None, multiprocess=False, **engine_args)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
    # Two waves: the second finds the first's blocks freed but still cached.
    outputs = llm.generate(prompts[:3], params, use_tqdm=False) + llm.generate(prompts[3:], params, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1, "blocks leaked after the run"
    return [o.outputs[0].token_ids for o in outputs], [o.num_cached_tokens for o in outputs], stats


MODES = [  # at num_gpu_blocks_override=6 (5 usable) three 56-token requests cannot all hold their blocks
    ("batched", {}),
    ("chunked", {"max_num_batched_tokens": 20}),
    ("preempted", {"num_gpu_blocks_override": 6}),
    ("chunked+preempted", {"max_num_batched_tokens": 20, "num_gpu_blocks_override": 6}),
]


@pytest.mark.parametrize("mode,args", MODES)
def test_greedy_with_caching_equals_without_and_hf(mode, args, tiny_llama_folder, shared_prompts):
    reference = hf_greedy(tiny_llama_folder, shared_prompts, MAX_TOKENS)
    tokens_on, cached_on, stats = run_engine(tiny_llama_folder, shared_prompts, max_model_len=256, **args)
    tokens_off, cached_off, _ = run_engine(tiny_llama_folder, shared_prompts, max_model_len=256,
                                           enable_prefix_caching=False, **args)
    assert tokens_on == tokens_off == reference
    assert cached_off == [0] * 5 and stats["prefix_cache_hits"] > 0
    assert cached_on[3] == 32  # the repeated prompt, found in blocks the first generate() freed
    if "num_gpu_blocks_override" in args:
        assert stats["num_preemptions"] > 0


def test_smollm2_greedy_with_caching_matches_hf_chunked_and_preempted(shared_prompts, smollm_folder):
    reference = hf_greedy(smollm_folder, shared_prompts, MAX_TOKENS)
    tokens, cached, stats = run_engine(None, shared_prompts, **MODES[-1][1])
    assert tokens == reference
    assert stats["num_preemptions"] > 0 and stats["prefix_cache_hits"] > 0 and cached[3] == 32


@pytest.mark.parametrize("backend", ["torch", "cpu", "triton"])
def test_same_step_hits_read_blocks_written_in_that_step_on_every_backend(backend, tiny_llama_folder, tokenizer):
    """Two requests admitted together: the second reads the first's prompt blocks in the forward that writes them."""
    prompts = [tokenizer.encode(PREFIX + s) for s in SUFFIXES[:2]]
    outs = {}
    for caching in (True, False):
        llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256, attention_backend=backend,
                  enable_prefix_caching=caching)
        result = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), use_tqdm=False)
        llm.shutdown()
        outs[caching] = [o.outputs[0].token_ids for o in result]
        if caching:
            assert [o.num_cached_tokens for o in result] == [0, 32]
    assert outs[True] == outs[False]


def test_n_children_share_their_prompt_blocks(tiny_llama_folder, tokenizer):
    prompt = tokenizer.encode(PREFIX + SUFFIXES[0])  # 44 tokens: 2 full blocks of 16
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    samples, hits = {}, {}
    for caching in (True, False):
        llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256, enable_prefix_caching=caching)
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        samples[caching], hits[caching] = [c.token_ids for c in out.outputs], llm.llm_engine.get_stats()
        llm.shutdown()
    assert samples[True] == samples[False] and len(set(map(tuple, samples[True]))) == 3
    # the three children arrive together: children 1 and 2 hit child 0's blocks, cached when it was scheduled
    assert hits[True]["prefix_cache_hits"] == 2 * 32 and hits[True]["prefix_cache_queries"] == 3 * len(prompt)
    assert hits[False]["prefix_cache_hits"] == 0


def test_prompt_logprobs_are_the_same_after_a_cache_hit(tiny_llama_folder, tokenizer):
    prompt = tokenizer.encode(PREFIX + SUFFIXES[0])
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=2, prompt_logprobs=1)
    first = llm.generate([prompt], params, use_tqdm=False)[0]
    again = llm.generate([prompt], params, use_tqdm=False)[0]  # blocks cached, but it must compute every row
    llm.shutdown()
    assert again.num_cached_tokens == 0 and len(again.prompt_logprobs) == len(prompt)
    assert [None if d is None else {t: round(lp.logprob, 4) for t, lp in d.items()} for d in again.prompt_logprobs] \
        == [None if d is None else {t: round(lp.logprob, 4) for t, lp in d.items()} for d in first.prompt_logprobs]


def test_reset_prefix_cache_on_llm_and_refused_while_a_request_runs(tiny_llama_folder, tokenizer):
    prompt = tokenizer.encode(PREFIX + SUFFIXES[0])
    engine = LLMEngine.from_engine_args(EngineArgs(model=str(tiny_llama_folder), max_model_len=256),
                                        multiprocess=False)
    engine.add_request("a", prompt, SamplingParams(max_tokens=3))
    engine.step()
    assert engine.reset_prefix_cache() is False  # a request holds blocks
    while engine.has_unfinished_requests():
        engine.step()
    assert engine.reset_prefix_cache() is True
    stats = engine.get_stats()
    assert stats["prefix_cache_queries"] == stats["prefix_cache_hits"] == 0
    engine.shutdown()
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=2)
    llm.generate([prompt], params, use_tqdm=False)
    assert llm.generate([prompt], params, use_tqdm=False)[0].num_cached_tokens == 32
    assert llm.reset_prefix_cache() is True
    assert llm.generate([prompt], params, use_tqdm=False)[0].num_cached_tokens == 0
    llm.shutdown()
