"""Unit checks of labs 2 and 6 on a scheduler without a model: preemption, the stop check, reclamation.

Each case builds a real Scheduler (prefix caching on, no model: schedule() only) at block size 4, 8 or 16 with
odd prompt lengths: A and B share a two-block prefix, C shares nothing, D arrives after them and waits. Lab 2
preempts B (B's first two blocks are also A's); lab 6 finishes A and frees it. The observation is plain data:
statuses, counters, queues, every block's ref_cnt, the free queue in order, and the prefix-cache hit a request
with the freed prompt would get after the pool evicts all but one of the freed blocks (the free order decides
which survive).
"""
from __future__ import annotations

import random

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.core.sched.scheduler import Scheduler
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

BLOCK_SIZES = (4, 8, 16)
_PARAMS = SamplingParams(max_tokens=8, temperature=0)


def _build(block_size: int):
    rng = random.Random(block_size)
    toks = lambda n: [rng.randrange(1, 1000) for _ in range(n)]  # noqa: E731
    prefix = toks(2 * block_size)
    prompts = {"A": prefix + toks(block_size + 1), "C": toks(block_size + 5), "B": prefix + toks(block_size + 3)}
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=16 * block_size, max_model_len=64 * block_size),
                      CacheConfig(block_size=block_size, num_gpu_blocks=12))
    hasher = get_request_block_hasher(block_size)
    for rid, prompt in prompts.items():  # A, C, B: B is the tail of RUNNING
        sched.add_request(Request(rid, prompt, _PARAMS, 2, block_hasher=hasher))
    sched.schedule()
    sched.add_request(Request("D", toks(block_size + 1), _PARAMS, 2, block_hasher=hasher))
    return sched, prompts, hasher


def _blocks(sched, prompt, hasher, freed: int) -> dict:
    """The pool after the call, then the hit of `prompt` once the pool evicted all but one of `freed` blocks."""
    kvm, pool = sched.kv_cache_manager, sched.kv_cache_manager.block_pool
    out = {"held_by": {rid: [b.block_id for b in bl] for rid, bl in kvm.req_to_blocks.items()},
           "ref_cnt": [b.ref_cnt for b in pool.blocks],
           "free_queue": [b.block_id for b in pool.free_block_queue.get_all_free_blocks()]}
    evict = pool.get_num_free_blocks() - freed + 1
    if 0 < evict <= pool.get_num_free_blocks():
        pool.get_new_blocks(evict)
    out["hit"] = kvm.get_computed_blocks(Request("again", prompt, _PARAMS, 2, block_hasher=hasher))[1]
    return out


@unit
def lab2_observe(sub, llm, obs):
    """Preempt B (tail of RUNNING, sharing A's first two blocks) with the submission's _preempt_request."""
    obs["cases"] = []
    for block_size in BLOCK_SIZES:
        sched, prompts, hasher = _build(block_size)
        victim = sched.running.pop()
        own = sum(1 for b in sched.kv_cache_manager.req_to_blocks[victim.request_id] if b.ref_cnt == 1)
        before = sched.num_preemptions
        sub["_preempt_request"](sched, victim)
        case = {"block_size": block_size, "status": victim.status.name, "computed": victim.num_computed_tokens,
                "req_preemptions": victim.num_preemptions, "sched_preemptions": sched.num_preemptions - before,
                "registered": victim.request_id in sched.requests, "waiting": [r.request_id for r in sched.waiting]}
        case.update(_blocks(sched, prompts["B"], hasher, own))
        obs["cases"].append(case)


@unit
def lab6_free_observe(sub, llm, obs):
    """Finish A (sharing its first two blocks with B) and free it with the submission's _free_request."""
    obs["cases"] = []
    for block_size in BLOCK_SIZES:
        sched, prompts, hasher = _build(block_size)
        done = sched.running.pop(0)
        done.status = RequestStatus.FINISHED_STOPPED
        own = sum(1 for b in sched.kv_cache_manager.req_to_blocks[done.request_id] if b.ref_cnt == 1)
        sub["_free_request"](sched, done)
        case = {"block_size": block_size, "registered": done.request_id in sched.requests,
                "told": done.request_id in sched.finished_req_ids}
        case.update(_blocks(sched, prompts["A"], hasher, own))
        obs["cases"].append(case)


def _compare(check: str, what: str, fields, obs, ref) -> None:
    """LabCheckFailed at the first case and field (in `fields` order) where obs differs from ref."""
    for exp, got in zip(ref["cases"], obs["cases"]):
        for key, label, hint in fields:
            if got[key] != exp[key]:
                where = f"block_size {exp['block_size']}, {what}: {label}"
                if key == "ref_cnt":
                    bad = next(i for i, (e, g) in enumerate(zip(exp[key], got[key])) if e != g)
                    where, exp_v, got_v = f"{where} of block {bad}", exp[key][bad], got[key][bad]
                    if got_v > exp_v:
                        hint = ("the request's references were never dropped: blocks taken out of req_to_blocks "
                                "without kv_cache_manager.free keep their ref_cnt and leak")
                else:
                    exp_v, got_v = exp[key], got[key]
                raise LabCheckFailed(check, where, exp_v, got_v, hint)


_TAIL_FIRST = ("its blocks go back tail first (kv_cache_manager.free does): the free queue is the eviction order, "
               "and the head of a prefix, which other requests share, must be evicted last")
_BLOCKS = [("held_by", "blocks held per request", "no blocks stay held by the request: give them back through "
            "self.kv_cache_manager.free"),
           ("ref_cnt", "ref_cnt", "a block shared with another request loses one reference, not all: it stays "
            "held by the other request"),
           ("free_queue", "free queue (block ids, head first)", _TAIL_FIRST),
           ("hit", "prefix-cache hit of the same prompt once the pool needs all but one freed block",
            "full blocks stay cached when freed (lazy eviction), and " + _TAIL_FIRST)]


def lab2_state_judge(obs, ref):
    _compare("preemption: victim state and counters", "after _preempt_request(B)", [
        ("status", "status", "mark the request as preempted"),
        ("computed", "num_computed_tokens", "recompute: its KV is gone, so none of its tokens count as computed"),
        ("req_preemptions", "request.num_preemptions",
         "count the preemption on the request itself too (metrics and the prefix-cache stats read it)"),
        ("sched_preemptions", "scheduler.num_preemptions, increase",
         "count each preemption once on the scheduler (self.num_preemptions)"),
        ("registered", "still in scheduler.requests", "a preempted request is still the scheduler's: keep it in "
         "self.requests (it is only out of RUNNING)"),
        ("waiting", "WAITING, head first", "a preempted request goes first in WAITING, ahead of requests that "
         "arrived after it (otherwise it starves)")], obs, ref)


def lab2_blocks_judge(obs, ref):
    _compare("preemption: shared blocks and free order", "after _preempt_request(B), B sharing A's first blocks",
             _BLOCKS, obs, ref)


def lab6_state_judge(obs, ref):
    _compare("free: request forgotten, runner told", "after _free_request(A)", [
        ("registered", "still in scheduler.requests", "forget a finished request: remove it from self.requests "
         "(a freed request left there leaks, and the scheduler still counts it)"),
        ("told", "in scheduler.finished_req_ids", "tell the runner: add its id to self.finished_req_ids, so the "
         "next step releases its row in the input batch"),
        ("held_by", "blocks held per request", "give its blocks back through self.kv_cache_manager.free")],
        obs, ref)


def lab6_blocks_judge(obs, ref):
    _compare("free: shared blocks, free order, later hits", "after _free_request(A), A sharing B's first blocks",
             _BLOCKS, obs, ref)


# -- lab 6: check_stop on hand-made requests (EOS = 2) ------------------------------------------------------
_LENGTH = "the length check comes first: at max_tokens (or max_model_len) a request is length-capped, whatever its " \
          "last token"
_STOP_CASES = [  # (label, sampling params, prompt length, output tokens, max_model_len, hint)
    ("EOS as the 3rd output token", dict(max_tokens=10), 5, [5, 6, 2], 8192, "the last token equal to EOS stops"),
    ("EOS with ignore_eos", dict(max_tokens=10, ignore_eos=True), 5, [5, 2], 8192, "ignore_eos: EOS does not stop"),
    ("EOS before min_tokens", dict(max_tokens=10, min_tokens=3), 5, [5, 2], 8192,
     "nothing but the length stops a request before min_tokens outputs"),
    ("EOS exactly at min_tokens", dict(max_tokens=10, min_tokens=3), 7, [5, 6, 2], 8192,
     "min_tokens outputs reached: EOS stops again (>=, not >)"),
    ("a stop_token_ids token", dict(max_tokens=10, stop_token_ids=[9]), 5, [5, 9], 8192,
     "a token of stop_token_ids stops, and stop_reason names it"),
    ("a stop token before min_tokens", dict(max_tokens=10, min_tokens=3, stop_token_ids=[9]), 3, [5, 9], 8192,
     "nothing but the length stops a request before min_tokens outputs"),
    ("max_tokens reached", dict(max_tokens=2), 5, [5, 6], 8192, "max_tokens counts output tokens; >=, not >"),
    ("one token short of max_tokens", dict(max_tokens=3), 5, [5, 6], 8192, "max_tokens not reached yet"),
    ("EOS as the last allowed token", dict(max_tokens=3), 5, [5, 6, 2], 8192, _LENGTH),
    ("a stop token as the last allowed token", dict(max_tokens=2, stop_token_ids=[9]), 9, [5, 9], 8192, _LENGTH),
    ("max_model_len reached", dict(max_tokens=10), 5, [5, 6], 7, "num_tokens (prompt + outputs) >= max_model_len "
     "ends a request: the prompt counts, and >=, not >"),
    ("one token short of max_model_len", dict(max_tokens=10), 5, [5, 6], 8, "num_tokens < max_model_len: go on"),
    ("max_tokens None: max_model_len caps", dict(max_tokens=None), 7, [5, 6], 9, "max_tokens None means "
     "max_model_len"),
    ("EOS at max_model_len", dict(max_tokens=10), 3, [5, 2], 5, _LENGTH)]


@unit
def lab6_stop_observe(sub, llm, obs):
    """Each case's (stopped, status, stop_reason) after check_stop."""
    obs["cases"] = []
    for _, params, prompt_len, outputs, max_model_len, _ in _STOP_CASES:
        req = Request("r", [7] * prompt_len, SamplingParams(temperature=0, **params), 2)
        req.status = RequestStatus.RUNNING
        for t in outputs:
            req.append_output_token_ids(t)
        stopped = sub["check_stop"](req, max_model_len)
        reason = req.stop_reason
        obs["cases"].append([bool(stopped), req.status.name, reason if isinstance(reason, (int, str)) else None])


def lab6_stop_judge(obs, ref):
    for (label, params, prompt_len, outputs, max_model_len, hint), exp, got in zip(_STOP_CASES, ref["cases"],
                                                                                   obs["cases"]):
        if got != exp:
            raise LabCheckFailed("stop check: every rule and boundary", f"{label}: a {prompt_len}-token prompt, "
                                 f"outputs {outputs}, {params}, max_model_len {max_model_len}",
                                 f"(stopped, status, stop_reason) = {tuple(exp)}", tuple(got), hint)
