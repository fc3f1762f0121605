"""Unit checks of lab 12 (the prefix-cache lookup), without an engine: KVCacheManager.get_computed_blocks on
pools filled by hand at block sizes 4, 8 and 16.

A case is a real KVCacheManager whose cache holds the blocks of earlier prompts, some still held by a running
request and some free (cached, waiting for a hit or eviction), with chosen blocks evicted; then one lookup. The
submission's answer (block ids, tokens) and the pool after the call (ref_cnts, free queue, cache) are compared
with the engine's own function on the same case.
"""
from __future__ import annotations

from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

BLOCK_SIZES = (4, 8, 16)
_HOLE = "the hits are a prefix: stop at the first block that misses, a later hit is of no use without it"
_CAP = ("at most num_tokens - 1 tokens, in whole blocks: (num_tokens - 1) // block_size blocks at most, so the "
        "last token always runs")
_WHOLE = "num_computed_tokens is len(blocks) * block_size: whole blocks only"
_SKIP = "a request with skip_reading_prefix_cache (it asks for prompt logprobs) reads nothing: ([], 0)"
# (label, blocks of the cached prompt, tokens of the looked-up prompt as (whole blocks, extra), evicted block
#  indices, prompt_logprobs, hint); the looked-up prompt shares the cached prompt's first blocks
CASES = [("a prompt cached whole, a multiple of block_size", 3, (3, 0), (), None, _CAP),
         ("a prompt cached whole, one token past its blocks", 3, (3, 1), (), None, _WHOLE),
         ("3 of 4 blocks cached, 2 tokens past them", 3, (4, 2), (), None, _WHOLE),
         ("block 1 evicted, blocks 0 and 2 still cached", 3, (3, 1), (1,), None, _HOLE),
         ("block 0 evicted, blocks 1 and 2 still cached", 3, (3, 1), (0,), None, _HOLE),
         ("a prompt shorter than one block", 3, (0, 3), (), None, _CAP),
         ("cached whole, but it asks for prompt logprobs", 3, (3, 1), (), 1, _SKIP)]


def _case(block_size: int, case):
    """(manager, request): the cached prompt's blocks free or held, `evicted` dropped, a request to look up."""
    _, cached, (whole, extra), evicted, prompt_logprobs, _ = case
    kvm, hasher = KVCacheManager(block_size, 24), get_request_block_hasher(block_size)
    tokens = [7 + (i * 13) % 97 for i in range(4 * block_size + 3)]
    first = Request("first", tokens[:cached * block_size + 1], SamplingParams(max_tokens=1), 2, block_hasher=hasher)
    other = Request("other", [500 + i for i in range(2 * block_size)], SamplingParams(max_tokens=1), 2,
                    block_hasher=hasher)
    for req in (first, other):
        kvm.allocate_slots(req, req.num_tokens)
    kvm.free(first)  # its blocks wait in the free queue, still cached; "other" keeps holding its own
    kvm.block_pool.get_new_blocks(1)  # one uncached block popped: the queue's head moves
    kvm.block_pool.evict_blocks([kvm.block_pool.get_cached_block(first.block_hashes[i]) for i in evicted])
    params = SamplingParams(max_tokens=1, prompt_logprobs=prompt_logprobs)
    return kvm, Request("again", tokens[:whole * block_size + extra], params, 2, block_hasher=hasher)


def _pool(kvm) -> dict:
    pool = kvm.block_pool
    return {"ref_cnt": [b.ref_cnt for b in pool.blocks], "free": [b.block_id for b in pool.free_block_queue
                                                                  .get_all_free_blocks()],
            "cached": sorted(b.block_id for b in pool.blocks if b.block_hash is not None)}


@unit
def lab12_lookup_observe(sub, llm, obs):
    obs["lookups"] = []
    for block_size in BLOCK_SIZES:
        for case in CASES:
            kvm, request = _case(block_size, case)
            before = _pool(kvm)
            got = sub["get_computed_blocks"](kvm, request)
            if not (isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], list)):
                obs["lookups"].append({"bad": f"{type(got).__name__} {repr(got)[:60]}"})
                continue
            blocks, tokens = got
            obs["lookups"].append({"ids": [getattr(b, "block_id", repr(b)[:20]) for b in blocks],
                                   "tokens": tokens if isinstance(tokens, int) else repr(tokens)[:40],
                                   "changed": _pool(kvm) != before, "pool": _pool(kvm)})


def _cases():
    return [(bs, case) for bs in BLOCK_SIZES for case in CASES]


def _where(block_size, case, what) -> str:
    label, _, (whole, extra), _, _, _ = case
    return f"block_size {block_size}, {label} ({whole * block_size + extra}-token prompt): {what}"


def lab12_lookup_judge(obs, ref):
    check = "lookup: the longest cached prefix, capped"
    for (block_size, case), exp, got in zip(_cases(), ref["lookups"], obs["lookups"]):
        if "bad" in got:
            raise LabCheckFailed(check, _where(block_size, case, "return value"), "(list of blocks, int)",
                                 got["bad"], "return a tuple (blocks, num_computed_tokens)")
        for what in ("ids", "tokens"):
            if got[what] != exp[what]:
                name = "block ids" if what == "ids" else "num_computed_tokens"
                hint = case[-1] if what == "ids" else _WHOLE
                raise LabCheckFailed(check, _where(block_size, case, name), exp[what], got[what], hint)


def lab12_state_judge(obs, ref):
    check = "lookup: nothing taken, the pool unchanged"
    for (block_size, case), exp, got in zip(_cases(), ref["lookups"], obs["lookups"]):
        if "bad" in got:
            raise LabCheckFailed(check, _where(block_size, case, "return value"), "(list of blocks, int)",
                                 got["bad"], "return a tuple (blocks, num_computed_tokens)")
        for what in ("ref_cnt", "free", "cached"):
            if got["pool"][what] != exp["pool"][what]:
                name = {"ref_cnt": "ref_cnt of every block", "free": "the free queue",
                        "cached": "the cached blocks"}[what]
                raise LabCheckFailed(check, _where(block_size, case, name + " after the lookup"),
                                     exp["pool"][what], got["pool"][what],
                                     "look up only: allocate_slots touches the hits when it takes them, so a "
                                     "touch here counts each hit twice and its blocks never come back")
