"""Engine checks of labs 9, 10 and 11, on the engine with n-gram speculation (engine_checks.NGRAM: 4 drafts, n-grams
of 1 to 4 tokens; max_model_len 64; 12 blocks of 8 tokens).

Each scenario is judged as tokens_check judges (every invariant after every step, the tokens equal to the
reference's), plus what the lab's function decides: the tokens scheduled for each request at each step (from
each SchedulerOutput, drafts included), the drafts proposed after each step (from update_draft_token_ids), and
the spec-decode counters (drafts, draft tokens, accepted tokens, accepted per position). Two of the prompts
repeat themselves, so the proposer finds matches and the target accepts many drafts, not all: both paths of the
rejection sampler run.
"""
from __future__ import annotations

import contextlib

from minivllm.labs import engine_checks as ec
from minivllm.labs.errors import LabCheckFailed
from minivllm.sampling_params import SamplingParams

REPEATING = ["1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", "a b c d a b c d a b"]  # 32 and 10 tokens
GREEDY = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
TO_THE_END = SamplingParams(max_tokens=None, temperature=0, ignore_eos=True)  # until max_model_len
_SPECULATING = ("speculative", "to-max-model-len")  # scenarios whose reference must accept some drafts, not all


@contextlib.contextmanager
def configured(llm, **changes):
    """Run with some scheduler_config fields changed (budget, threshold, chunked prefill); restore them after."""
    cfg = ec.scheduler_of(llm).scheduler_config
    old = {name: getattr(cfg, name) for name in changes}
    for name, value in changes.items():
        setattr(cfg, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(cfg, name, value)


def _counters(sched) -> list[int]:
    s = sched.spec_decoding_stats
    return [s.num_drafts, s.num_draft_tokens, s.num_accepted_tokens, *s.num_accepted_tokens_per_pos]


def scenario(kind: str, llm, obs: dict) -> dict:
    """Run one scenario (engine_checks.run, bounded), recording as it goes "schedule": per step [[request id,
    tokens scheduled (drafts included)], ...], "proposed": per step [[request id, drafts proposed], ...], and at the
    end "counters": the spec-decode counters the run added."""
    sched = ec.scheduler_of(llm)
    schedule, proposed = obs.setdefault("schedule", []), obs.setdefault("proposed", [])
    original, before = (sched.schedule, sched.update_draft_token_ids), _counters(sched)

    def recording_schedule():
        out = original[0]()
        schedule.append(sorted([int(rid), int(n)] for rid, n in out.num_scheduled_tokens.items()))
        return out

    def recording_drafts(draft_token_ids):
        proposed.append(sorted([int(rid), [int(t) for t in drafts]] for rid, drafts in
                               zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids)))
        return original[1](draft_token_ids)
    sched.schedule, sched.update_draft_token_ids = recording_schedule, recording_drafts
    try:
        if kind == "speculative":  # one prompt that repeats nothing: requests without drafts beside others
            ec.run(llm, [*REPEATING, ec.PROMPTS[0]], GREEDY, obs)
        elif kind == "to-max-model-len":  # 4 drafts a step until the last positions, and a preemption
            ec.run(llm, REPEATING, TO_THE_END, obs)
        elif kind == "threshold":  # chunks of 5 in a budget of 12: the third prompt gets what is left
            with configured(llm, max_num_batched_tokens=12, long_prefill_token_threshold=5):
                ec.run(llm, [*REPEATING, ec.PROMPTS[0]], GREEDY, obs)
        elif kind == "unchunked":  # prompts of 4, 5 and 8 tokens in a budget of 12: the third waits, whole
            with configured(llm, max_num_batched_tokens=12, enable_chunked_prefill=False,
                            long_prefill_token_threshold=4):  # a threshold that only chunked prefill obeys
                ec.run(llm, ec.PROMPTS[:3], GREEDY, obs)
        elif kind == "exact-fit":  # prompts of 4 and 8 tokens in a budget of 12, unchunked: the second fits exactly
            with configured(llm, max_num_batched_tokens=12, enable_chunked_prefill=False):
                ec.run(llm, [ec.PROMPTS[0], ec.PROMPTS[2]], GREEDY, obs)
        else:
            raise KeyError(kind)
    finally:
        sched.schedule, sched.update_draft_token_ids = original
        obs["counters"] = [after - b for after, b in zip(_counters(sched), before)]
    return obs


def _same_steps(check: str, expected: list, got: list, field: int, what: str, hint: str) -> None:
    """LabCheckFailed at the first step and request whose `field` differs; requests named by their index in the
    order they were submitted."""
    def by_index(steps):
        ids = sorted({r[0] for step in steps for r in step})
        return [{ids.index(r[0]): r[field] for r in step} for step in steps]
    for step, (exp, mine) in enumerate(zip(by_index(expected), by_index(got)), 1):
        if exp != mine:
            req = next(r for r in sorted(set(exp) | set(mine)) if exp.get(r) != mine.get(r))
            raise LabCheckFailed(check, f"step {step}, request {req}: {what}", exp.get(req, "none"),
                                 mine.get(req, "none"), hint)
    if len(expected) != len(got):
        raise LabCheckFailed(check, f"number of steps with {what}", len(expected), len(got), hint)


def spec_check(kind: str, check: str, hint: str, decides: str):
    """(observe, judge) of one scenario: the invariants, then what the lab decides ("schedule": tokens per request
    and step; "drafts": the drafts proposed after each step), the tokens, then ("accepted") the spec-decode
    counters."""
    def observe(sub, llm, obs):
        scenario(kind, llm, obs)

    def judge(obs, ref):
        if kind in _SPECULATING and not 0 < ref["counters"][2] < ref["counters"][1]:
            raise RuntimeError(f"the grader's {kind} scenario accepted no draft, or all: the grader needs fixing")
        ec.judge_run(obs)
        if decides == "schedule":
            _same_steps(check, ref["schedule"], obs["schedule"], 1, "tokens scheduled", hint)
        if decides == "drafts":
            _same_steps(check, ref["proposed"], obs["proposed"], 1, "drafts proposed", hint)
        ec.same_tokens(check, ref["tokens"], obs["tokens"], hint)
        if decides == "accepted" and obs["counters"] != ref["counters"]:
            raise LabCheckFailed(check, "spec-decode counters [drafts, draft tokens, accepted, accepted at "
                                 "position 0, 1, 2, 3]", ref["counters"], obs["counters"],
                                 "a draft equal to the argmax of its row must be kept: rejecting it gives the same "
                                 "tokens one step at a time, without the speed-up")
    return observe, judge
