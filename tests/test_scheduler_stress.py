"""Randomized stress test of the Scheduler, driven by hand with a synthetic model (no tensors).

Each scenario draws from its own `random.Random(seed)` a config (block_size, a small KV pool so that
preemption is frequent, token budget, max_num_seqs, max_model_len, chunked prefill on/off,
long_prefill_token_threshold, FCFS or priority, prefix caching on in most), then random arrivals,
prompts cut from a few shared prefixes (so that cached blocks hit, are shared and get evicted), prompt
lengths, max/min_tokens, EOS / stop_token_ids / ignore_eos, prompt_logprobs (which skips reading the cache),
and aborts of waiting or running requests (between steps and while a step runs). The synthetic model
samples one token per request that caught up with its last token, and keeps a synthetic KV cache: each
step it first writes every scheduled token's "KV" (a value standing for the token's whole prefix) into
its slot, then checks every scheduled request's history reads back as its own prefix, as a layer of the
real attention does (so a hit on a block written in the same step is checked too).

After every step: the token budget and max_num_seqs hold; without chunked prefill no prompt is split
(not even by long_prefill_token_threshold);
the block pool is consistent (no block twice in one request, ref_cnt == number of owners, 0 when free,
a block with several owners is a cached one, null block 0 never owned, free + owned == num_gpu_blocks - 1,
RUNNING requests hold exactly cdiv(computed, block_size) blocks, WAITING/PREEMPTED hold none); the cache
map and the blocks' hashes agree, and every cached block holds the KV of the prefix its hash names; a hit
is whole blocks, at most num_tokens - 1 tokens, none with caching off or prompt_logprobs; waiting and
running are disjoint, duplicate-free and together are exactly the unfinished requests; preempted
requests restart from 0 at the head of WAITING (FCFS) and an FCFS step that preempts admits nobody;
no output exceeds max_tokens, no KV exceeds max_model_len. Refusals at add_request are exactly the
requests that could never fit. Each scenario drains under a step cap (a livelock fails it); every
accepted request finishes exactly once, with a reason consistent with its stop conditions, and every
block is free at the end.

Reproduce one scenario: MINIVLLM_STRESS_SEED=<seed>; run more: MINIVLLM_STRESS_SCENARIOS=<n>.
"""
from __future__ import annotations

import os
import random
import time
from collections import Counter

import pytest

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.utils.math_utils import cdiv
from minivllm.core.sched.scheduler import Scheduler
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

EOS, STOP, PLAIN = 2, 3, 5
CMD = ".venv/bin/python -m pytest tests/test_scheduler_stress.py -q -s -k random_scenarios"
SEEDS = ([int(os.environ["MINIVLLM_STRESS_SEED"])] if os.environ.get("MINIVLLM_STRESS_SEED")
         else range(int(os.environ.get("MINIVLLM_STRESS_SCENARIOS", "150"))))


def peak_kv_tokens(prompt_len: int, max_tokens: int | None, max_model_len: int) -> int:
    """KV slots a request can ever need: its last sampled token is never computed, and a prompt of
    exactly max_model_len still samples one token."""
    return prompt_len + min(max_tokens or max_model_len, max(1, max_model_len - prompt_len)) - 1


class Scenario:
    def __init__(self, seed: int) -> None:
        self.rng = rng = random.Random(seed)
        bs, mml = rng.choice([1, 2, 4, 8, 16]), rng.randint(2, 96)
        chunked = rng.random() < 0.6
        budget = rng.randint(1, 2 * mml) if chunked else rng.randint(mml, 3 * mml)
        self.sc = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=rng.randint(1, 12), max_model_len=mml,
                                  enable_chunked_prefill=chunked, policy=rng.choice(["fcfs", "priority"]),
                                  long_prefill_token_threshold=rng.choice([0, 0, rng.randint(1, mml)]))
        self.cc = CacheConfig(block_size=bs, num_gpu_blocks=1 + cdiv(rng.randint(mml // 3 + 1, 3 * mml), bs),
                              enable_prefix_caching=rng.random() < 0.8)
        self.s = Scheduler(self.sc, self.cc)
        self.hasher = get_request_block_hasher(bs) if self.cc.enable_prefix_caching else None
        self.prefixes = [[rng.randint(10, 12) for _ in range(mml + mml // 8 + 1)] for _ in range(3)]
        self.kv: dict[int, list] = {}  # the synthetic KV cache: block id -> per slot, the prefix value written
        self.values: dict[str, list[int]] = {}  # request id -> per position, a value naming its prefix
        self.hash_values: dict[bytes, list[int]] = {}  # block hash -> the values that block must hold
        self.num_hashes_seen: dict[str, int] = {}  # request id -> how many of its block hashes are in hash_values
        self.p_eos, self.p_stop, self.p_abort = rng.uniform(0, 0.15), rng.uniform(0, 0.1), rng.uniform(0, 0.05)
        self.accepted: dict[str, Request] = {}
        self.finished: dict[str, str] = {}  # request id -> finish reason
        self.peak: dict[str, int] = {}  # request id -> KV slots it may ever hold
        self.num_refused = self.step_no = self.next_id = 0
        self.ctx = (f"seed={seed} {self.sc} {self.cc}\n  reproduce: MINIVLLM_STRESS_SEED={seed} {CMD}")

    def fail(self, msg: str) -> str:  # built only when an assert fails
        return f"[step {self.step_no}] {msg}\n  {self.ctx}"

    def arrive(self) -> None:
        rng, mml = self.rng, self.sc.max_model_len
        prompt_len = 0 if rng.random() < 0.02 else rng.randint(1, mml + mml // 8 + 1)
        max_tokens = None if rng.random() < 0.1 else rng.randint(1, 40)
        params = SamplingParams(max_tokens=max_tokens, ignore_eos=rng.random() < 0.2,
                                min_tokens=rng.randint(0, max_tokens or 8) if rng.random() < 0.3 else 0,
                                stop_token_ids=[STOP] if rng.random() < 0.3 else None,
                                prompt_logprobs=1 if rng.random() < 0.05 else None)
        shared = rng.randint(0, prompt_len)  # a shared prefix, then tokens of its own
        prompt = rng.choice(self.prefixes)[:shared] + [rng.randint(10, 12) for _ in range(prompt_len - shared)]
        req = Request(f"r{self.next_id}", prompt, params, EOS if rng.random() < 0.8 else None,
                      priority=rng.randint(0, 3), arrival_time=self.step_no + rng.uniform(-3, 3),
                      block_hasher=self.hasher)
        self.next_id += 1
        fits = 0 < prompt_len < mml and cdiv(peak_kv_tokens(prompt_len, max_tokens, mml),
                                              self.cc.block_size) <= self.cc.num_gpu_blocks - 1
        try:
            self.s.add_request(req)
        except ValueError as e:
            assert not fits, self.fail(f"{req} (max_tokens={max_tokens}) fits the pool but was refused: {e}")
            self.num_refused += 1
            return
        assert fits, self.fail(f"{req} (max_tokens={max_tokens}) can never fit the pool but was accepted")
        self.accepted[req.request_id] = req
        self.peak[req.request_id] = peak_kv_tokens(prompt_len, max_tokens, mml)

    def abort_one(self) -> None:
        if self.s.requests:
            rid = self.rng.choice(sorted(self.s.requests))
            self.s.finish_requests([rid], RequestStatus.FINISHED_ABORTED)
            assert rid not in self.finished, self.fail(f"{rid} finished twice (abort after {self.finished.get(rid)})")
            self.finished[rid] = "abort"

    def step(self, allow_aborts: bool) -> None:
        s, rng, mml = self.s, self.rng, self.sc.max_model_len
        self.step_no += 1
        so = s.schedule()
        self.check_state(so)
        self.forward(so)
        ids = list(so.num_scheduled_tokens)
        sampled = [[] if s.requests[r].num_computed_tokens < s.requests[r].num_tokens else
                   [EOS if (x := rng.random()) < self.p_eos else STOP if x < self.p_eos + self.p_stop else PLAIN]
                   for r in ids]
        if allow_aborts and rng.random() < self.p_abort:
            self.abort_one()  # while the step "runs": its output must be ignored
        out = s.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, sampled))
        for o in out.outputs:
            req, p = self.accepted[o.request_id], self.accepted[o.request_id].sampling_params
            assert o.request_id not in self.finished, self.fail(f"output for already finished {req}: {o}")
            assert req.num_output_tokens <= (p.max_tokens or mml), self.fail(f"{req}: too many outputs, {p}")
            last, n = req.output_token_ids[-1], req.num_output_tokens
            length = n >= (p.max_tokens or mml) or req.num_tokens >= mml
            stop = n >= p.min_tokens and (last in p.stop_token_ids or (last == req.eos_token_id and not p.ignore_eos))
            assert o.finish_reason == ("length" if length else "stop" if stop else None), self.fail(
                f"{req} got finish_reason={o.finish_reason!r} with outputs={n} last={last} {p}")
            if o.finish_reason:
                self.finished[o.request_id] = o.finish_reason

    def check_state(self, so) -> None:
        s, sc, cc, n = self.s, self.sc, self.cc, so.num_scheduled_tokens
        assert so.total_num_scheduled_tokens == sum(n.values()) <= sc.max_num_batched_tokens and all(n.values()), \
            self.fail(f"scheduled {n} (total {so.total_num_scheduled_tokens}), budget {sc.max_num_batched_tokens}")
        assert len(n) <= sc.max_num_seqs and len(s.running) <= sc.max_num_seqs, \
            self.fail(f"{len(n)} scheduled / {len(s.running)} running > max_num_seqs={sc.max_num_seqs}")
        if not sc.enable_chunked_prefill:
            split = [s.requests[r] for r in n if s.requests[r].num_computed_tokens < s.requests[r].num_tokens]
            assert not split, self.fail(f"prompt split without chunked prefill: {split}, scheduled {n}")
        wids, rids = [r.request_id for r in s.waiting], [r.request_id for r in s.running]
        unfinished = self.accepted.keys() - self.finished.keys()
        assert len(set(wids)) + len(set(rids)) == len(wids) + len(rids) == len(unfinished) and \
            set(wids) | set(rids) == unfinished == set(s.requests), \
            self.fail(f"waiting={wids} running={rids} vs unfinished={sorted(unfinished)} ({sorted(s.requests)})")
        kv, pool = s.kv_cache_manager, s.kv_cache_manager.block_pool
        owners = Counter(b.block_id for blocks in kv.req_to_blocks.values() for b in blocks)
        free = pool.free_block_queue.get_all_free_blocks()
        assert all(len({b.block_id for b in blocks}) == len(blocks) for blocks in kv.req_to_blocks.values()), \
            self.fail(f"a block twice in one request: {kv.req_to_blocks}")
        assert all(pool.blocks[i].ref_cnt == n and (n == 1 or pool.blocks[i].block_hash is not None)
                   for i, n in owners.items()) and 0 not in owners and all(b.ref_cnt == 0 for b in free), \
            self.fail(f"ref counts != owners, an uncached block shared, or null block owned: {owners} free={free}")
        assert len(free) == pool.get_num_free_blocks() == cc.num_gpu_blocks - 1 - len(owners), \
            self.fail(f"free={len(free)} ({pool.get_num_free_blocks()}) + owned={len(owners)} != pool-1")
        cached = {b.block_id: h for h, same in pool.cached_block_hash_to_block.items() for b in same.values()}
        assert cached == {b.block_id: b.block_hash for b in pool.blocks if b.block_hash is not None} and \
            all(i == b.block_id for same in pool.cached_block_hash_to_block.values() for i, b in same.items()) and \
            (cc.enable_prefix_caching or not cached), self.fail(f"cache map and block hashes disagree: {cached}")
        for new in so.scheduled_new_reqs:
            r, hit = s.requests[new.req_id], new.num_computed_tokens
            assert hit % cc.block_size == 0 and hit <= r.num_tokens - 1 and (hit == 0 or (
                cc.enable_prefix_caching and not r.skip_reading_prefix_cache)), self.fail(f"{r}: bad cache hit {hit}")
        for r in s.requests.values():
            held, status = len(kv.req_to_blocks.get(r.request_id, ())), r.status
            want = cdiv(r.num_computed_tokens, cc.block_size) if status == RequestStatus.RUNNING else 0
            assert held == want and (status == RequestStatus.RUNNING) == (r.request_id in rids) and \
                not r.is_finished(), self.fail(f"{r} holds {held} blocks, expected {want}")
            assert r.num_computed_tokens <= min(r.num_tokens, self.peak[r.request_id]) and \
                r.num_tokens <= max(sc.max_model_len, r.num_prompt_tokens + 1), self.fail(f"{r} overruns its length")
        if so.preempted_req_ids:
            assert all(s.requests[i].status == RequestStatus.PREEMPTED and s.requests[i].num_computed_tokens == 0
                       for i in so.preempted_req_ids), self.fail(f"preempted {so.preempted_req_ids} not reset")
            if sc.policy == "fcfs":
                assert set(wids[:len(so.preempted_req_ids)]) == so.preempted_req_ids, \
                    self.fail(f"preempted {so.preempted_req_ids} not at the head of WAITING {wids}")
                assert not so.scheduled_new_reqs and not any(so.scheduled_cached_reqs.resumed_from_preemption), \
                    self.fail(f"FCFS admitted {[r.req_id for r in so.scheduled_new_reqs]} in a step that preempted")

    def prefix_values(self, r: Request) -> list[int]:
        """Per position of r, a value naming the whole prefix up to it: what a layer's K/V there depends on."""
        values = self.values.setdefault(r.request_id, [])
        if len(values) < r.num_tokens:
            tokens = r.all_token_ids
            for p in range(len(values), len(tokens)):
                values.append(hash((values[-1] if values else None, tokens[p])))
        return values

    def forward(self, so) -> None:
        """The synthetic model's KV: write every scheduled token, then check each request's history reads back."""
        s, bs = self.s, self.cc.block_size
        plan = []
        for rid, n in so.num_scheduled_tokens.items():
            r = s.requests[rid]
            values, blocks = self.prefix_values(r), s.kv_cache_manager.req_to_blocks[rid]
            start = r.num_computed_tokens - n  # schedule() has already advanced it
            for p in range(start, start + n):
                self.kv.setdefault(blocks[p // bs].block_id, [None] * bs)[p % bs] = values[p]
            plan.append((r, values, blocks, start))
        for r, values, blocks, start in plan:
            for i in range(cdiv(start, bs)):  # history, this step's own writes of other requests included
                lo, hi = i * bs, min((i + 1) * bs, start)
                assert self.kv[blocks[i].block_id][:hi - lo] == values[lo:hi], \
                    self.fail(f"{r} reads a block {blocks[i]} whose content is not its prefix")
        for r in s.requests.values():  # remember what each block hash must hold
            values = self.prefix_values(r)
            for i in range(self.num_hashes_seen.get(r.request_id, 0), len(r.block_hashes)):
                expected = self.hash_values.setdefault(r.block_hashes[i], values[i * bs:(i + 1) * bs])
                assert expected == values[i * bs:(i + 1) * bs], self.fail(f"{r}: one hash for two prefixes")
            self.num_hashes_seen[r.request_id] = len(r.block_hashes)
        for h, same in s.kv_cache_manager.block_pool.cached_block_hash_to_block.items():
            for block_id in same:
                assert self.kv.get(block_id) == self.hash_values[h], \
                    self.fail(f"cached block {block_id} does not hold the prefix its hash names")

    def run(self) -> int:
        rng, s = self.rng, self.s
        p_arrive = rng.uniform(0.1, 0.8)
        for _ in range(rng.randint(40, 200)):
            while rng.random() < p_arrive:
                self.arrive()
            if rng.random() < self.p_abort:
                self.abort_one()
            self.step(allow_aborts=True)
        cap = self.step_no + 100 + 10 * sum(self.peak[i] + 1 for i in s.requests)  # ~10x the worst drain seen
        while s.has_unfinished_requests():
            assert self.step_no < cap, self.fail(f"livelock: unfinished at step {cap}: {s.running} {list(s.waiting)}")
            self.step(allow_aborts=False)
        assert self.finished.keys() == self.accepted.keys(), self.fail("some accepted requests never finished")
        assert s.kv_cache_manager.block_pool.get_num_free_blocks() == self.cc.num_gpu_blocks - 1 and \
            not s.kv_cache_manager.req_to_blocks, self.fail("blocks leaked after every request finished")
        return self.step_no


def test_random_scenarios_keep_every_scheduler_invariant_and_drain(record_property):
    t0, steps, reasons, refused, preemptions, hits = time.perf_counter(), 0, Counter(), 0, 0, Counter()
    for seed in SEEDS:
        sc = Scenario(seed)
        steps += sc.run()
        reasons.update(sc.finished.values())
        refused, preemptions = refused + sc.num_refused, preemptions + sc.s.num_preemptions
        stats = sc.s.kv_cache_manager.prefix_cache_stats
        hits.update(hits=stats.hits, preempted_hits=stats.preempted_hits, queries=stats.queries)
    record_property("scheduler_steps", steps)
    print(f"\n{len(SEEDS)} scenarios, {steps} scheduler steps in {time.perf_counter() - t0:.1f}s; "
          f"finished {dict(reasons)}, refused {refused}, preemptions {preemptions}, prefix-cache tokens {dict(hits)}")
    if len(SEEDS) >= 50:  # the sweep really exercised preemption, cache hits and every way to finish
        assert preemptions and reasons["length"] and reasons["stop"] and reasons["abort"], reasons
        assert hits["hits"] and hits["preempted_hits"], hits


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
@pytest.mark.parametrize("num_requests", [1, 2])
@pytest.mark.parametrize("max_tokens", [11, None])  # 11: max_tokens caps the request; None: max_model_len=21 does
def test_requests_that_exactly_fill_the_pool_complete_without_livelock(chunked, policy, num_requests, max_tokens):
    prompt_len, mml = 10, 21  # either way: 10 prompt + 11 outputs, the last never cached -> 20 slots = 5 blocks of 4
    s = Scheduler(SchedulerConfig(max_num_batched_tokens=3 if chunked else mml, max_num_seqs=4, max_model_len=mml,
                                  enable_chunked_prefill=chunked, policy=policy),
                  CacheConfig(block_size=4, num_gpu_blocks=1 + 5))
    reqs = [Request(f"r{i}", [7] * prompt_len, SamplingParams(max_tokens=max_tokens, ignore_eos=True), EOS,
                    arrival_time=i) for i in range(num_requests)]
    for r in reqs:
        s.add_request(r)
    pool, min_free = s.kv_cache_manager.block_pool, 5
    for _ in range(500):
        if not s.has_unfinished_requests():
            break
        so = s.schedule()
        min_free = min(min_free, pool.get_num_free_blocks())
        ids = list(so.num_scheduled_tokens)
        s.update_from_output(so, ModelRunnerOutput(ids, {r: i for i, r in enumerate(ids)}, [
            [PLAIN] if s.requests[r].num_computed_tokens >= s.requests[r].num_tokens else [] for r in ids]))
    assert not s.has_unfinished_requests(), f"livelock after 500 steps: {s.running} {list(s.waiting)}"
    assert all(r.get_finished_reason() == "length" and r.num_output_tokens == 11 for r in reqs), reqs
    assert min_free == 0 and pool.get_num_free_blocks() == 5  # the whole pool was used, then all returned
    assert num_requests > 1 or s.num_preemptions == 0  # alone, it never has to preempt itself
