"""What the grader observes in the real engine, and how it judges what it observed.

Two halves, run in two processes. The observing half (`get_llm`, `run`, `snapshot`) runs in the grading
process, next to the submission: the engine runs in that process (multiprocess=False) so the submission's
function, patched in, is the one the engine calls; after every step it records a plain-data snapshot of the
scheduler (blocks per request, ref_cnts, free blocks, queues) and at the end the tokens. The judging half
(`judge_run`, `check_invariants`, `same_tokens`) runs in the grader's own process on those snapshots: token
budget respected, each block held at most once per request and ref_cnt equal to its holders, free + held ==
pool, queues consistent, every block back once all finish. Every run is bounded: MAX_STEPS engine steps.
"""
from __future__ import annotations

import contextlib

from minivllm.labs.errors import LabCheckFailed
from minivllm.sampling_params import SamplingParams

PROMPTS = ["Once upon a time", "The capital of France is", "Hi there, how are you today?", "1, 2, 3, 4, 5,"]
MAX_STEPS = 400  # every scenario of every lab finishes in under 100 steps with the reference
_LLMS: dict = {}  # (attention backend (None: the default), speculative) -> the shared engine
BACKEND = None  # the backend of the lab being graded (lab 5 grades on the PyTorch backend)
SPECULATIVE = False  # whether it grades on the engine with n-gram speculation (labs 9-11)
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}
SPEC_MAX_MODEL_LEN = 64  # short, so a scenario runs requests up to it


def use(lab) -> None:
    """Make get_llm() give the engine the lab's checks run on."""
    global BACKEND, SPECULATIVE
    BACKEND, SPECULATIVE = lab.backend, lab.speculative


def get_llm():
    """One small engine per kind for the whole process: block_size 8, 12 blocks (small enough to preempt); the
    speculative one with NGRAM drafts and max_model_len SPEC_MAX_MODEL_LEN."""
    key = (BACKEND, SPECULATIVE)
    if key not in _LLMS:
        from minivllm import LLM
        extra = dict(speculative_config=NGRAM, max_model_len=SPEC_MAX_MODEL_LEN) if SPECULATIVE else {}
        # enforce_eager: a replayed CPU graph would skip a student's Python in the decode steps
        _LLMS[key] = LLM(multiprocess=False, block_size=8, num_gpu_blocks_override=12, attention_backend=BACKEND,
                         enforce_eager=True, **extra)
    return _LLMS[key]


def scheduler_of(llm):
    return llm.llm_engine.engine_core.engine_core.scheduler


@contextlib.contextmanager
def budget(llm, max_num_batched_tokens: int):
    """Run with a smaller token budget (chunked prefill) and restore it afterwards."""
    cfg = scheduler_of(llm).scheduler_config
    old, cfg.max_num_batched_tokens = cfg.max_num_batched_tokens, max_num_batched_tokens
    try:
        yield
    finally:
        cfg.max_num_batched_tokens = old


class StepLimitExceeded(Exception):
    """More engine steps than MAX_STEPS: a loop that does not stop (or a request that never finishes)."""


@contextlib.contextmanager
def step_bound(engine, obs: dict, limit: int = MAX_STEPS):
    """Count engine.step() calls made by code the grader does not own (lab 1's loop); stop it past `limit`."""
    original, count = engine.step, [0]

    def bounded_step():
        count[0] += 1
        obs["steps"] = count[0]
        if count[0] > limit:
            obs["step_limit"] = limit
            raise StepLimitExceeded(f"more than {limit} engine steps")
        return original()
    engine.step = bounded_step
    try:
        yield
    finally:
        engine.step = original


@contextlib.contextmanager
def on_step(engine, record):
    """Call `record(outputs)` with what every engine.step() returns, for the duration."""
    original = engine.step

    def recording_step():
        outputs = original()
        record(outputs)
        return outputs
    engine.step = recording_step
    try:
        yield
    finally:
        engine.step = original


def snapshot(sched, out) -> dict:
    """The scheduler's state after one step, as plain data the grader's process judges."""
    kvm, pool = sched.kv_cache_manager, sched.kv_cache_manager.block_pool

    def queue(reqs):
        return [[r.request_id, r.status.name, bool(r.is_finished()), r.request_id in sched.requests] for r in reqs]
    return {"scheduled": None if out is None else int(out.total_num_scheduled_tokens),
            "budget": int(sched.scheduler_config.max_num_batched_tokens),
            "blocks": {rid: [int(b.block_id) for b in blocks] for rid, blocks in kvm.req_to_blocks.items()},
            "ref_cnt": [int(b.ref_cnt) for b in pool.blocks], "free": int(pool.get_num_free_blocks()),
            "pool": int(pool.num_gpu_blocks), "running": queue(sched.running), "waiting": queue(sched.waiting)}


def check_invariants(snap: dict, step: int) -> None:
    """Raise LabCheckFailed at the first broken invariant of one snapshot (the state after `step`)."""
    limit = snap["budget"]
    if snap["scheduled"] is not None and snap["scheduled"] > limit:
        raise LabCheckFailed("token budget", f"step {step}, total_num_scheduled_tokens", f"<= {limit}",
                             snap["scheduled"], "every scheduled token is taken from token_budget")
    holders: dict[int, int] = {}
    for req_id, ids in snap["blocks"].items():
        if len(set(ids)) != len(ids):
            raise LabCheckFailed("blocks owned once", f"step {step}, request {req_id}, block ids", "no repeats",
                                 ids, "a request holds each of its blocks once")
        for b in ids:
            holders[b] = holders.get(b, 0) + 1
    for block_id, ref_cnt in enumerate(snap["ref_cnt"][1:], 1):  # block 0 is the null block
        if ref_cnt != holders.get(block_id, 0):
            raise LabCheckFailed("blocks owned once", f"step {step}, block {block_id}, ref_cnt",
                                 holders.get(block_id, 0), ref_cnt,
                                 "a block's ref_cnt counts the requests whose block list holds it; "
                                 "blocks dropped without kv_cache_manager.free() keep theirs")
    held = sum(1 for c in snap["ref_cnt"][1:] if c > 0)
    if snap["free"] + held != snap["pool"] - 1:
        raise LabCheckFailed("nothing leaked", f"step {step}, free + held blocks", snap["pool"] - 1,
                             snap["free"] + held, "every block is either free or held by a request")
    queued = snap["running"] + snap["waiting"]
    for req_id, status, finished, known in queued:
        if finished or not known:
            raise LabCheckFailed("queues consistent", f"step {step}, request {req_id}, status",
                                 "unfinished and known to the scheduler", status,
                                 "a finished request leaves RUNNING and WAITING and scheduler.requests")
    if len({q[0] for q in queued}) != len(queued):
        raise LabCheckFailed("queues consistent", f"step {step}, queues", "each request in one queue once",
                             [q[0] for q in queued], "a preempted request leaves RUNNING")
    for req_id, status, _, _ in snap["running"]:
        if status != "RUNNING":
            raise LabCheckFailed("queues consistent", f"step {step}, request {req_id}, status", "RUNNING",
                                 status, "RUNNING holds only running requests")


def run(llm, prompts, params: SamplingParams, obs: dict) -> dict:
    """Drive the engine step by step (at most MAX_STEPS), filling `obs` as it goes: "snapshots" (one per
    step), then "tokens", "steps", "preemptions", "victims" [(step, request index)], "terminated", "final_free",
    "scheduled" and "held" (per step, [request index, tokens scheduled] and [request index, its block ids]).
    A run stops early at the first snapshot that breaks an invariant (the grader's process judges it)."""
    engine, sched = llm.llm_engine, scheduler_of(llm)
    outputs_seen, original_schedule = [], sched.schedule

    def recording_schedule():
        out = original_schedule()
        outputs_seen.append(out)
        return out
    sched.schedule = recording_schedule
    preemptions0, snaps = sched.num_preemptions, obs.setdefault("snapshots", [])
    try:
        ids = []
        for prompt in prompts:
            ids.append(engine.next_request_id())
            engine.add_request(ids[-1], prompt, params)
        finished, step = {}, 0
        while engine.has_unfinished_requests() and step < MAX_STEPS:
            step += 1
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
            snaps.append(snapshot(sched, outputs_seen[-1] if outputs_seen else None))
            try:
                check_invariants(snaps[-1], step)
            except LabCheckFailed:
                return obs  # the grader's process finds the same failure in the snapshot
        obs.update(terminated=not engine.has_unfinished_requests(), steps=step,
                   unfinished=sched.get_num_unfinished_requests())
        obs["final_free"] = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        obs["registered"] = sorted(sched.requests)
    finally:
        sched.schedule = original_schedule
    obs["victims"] = [[n, ids.index(r)] for n, out in enumerate(outputs_seen, 1)
                      for r in sorted(out.preempted_req_ids) if r in ids]  # (step, request index) of each preemption
    obs["scheduled"] = [sorted([ids.index(r), int(n)] for r, n in out.num_scheduled_tokens.items() if r in ids)
                       for out in outputs_seen]  # per step [request index, tokens scheduled]
    obs["held"] = [sorted([ids.index(r), b] for r, b in snap["blocks"].items() if r in ids) for snap in snaps]
    obs["tokens"] = [list(finished[r].outputs[0].token_ids) if r in finished else None for r in ids]
    obs["hits"] = [finished[r].num_cached_tokens if r in finished else None for r in ids]
    obs["preemptions"] = sched.num_preemptions - preemptions0
    return obs


def judge_run(obs: dict) -> None:
    """The grader's side of `run`: every snapshot's invariants, then termination, then nothing leaked."""
    for step, snap in enumerate(obs.get("snapshots", []), 1):
        check_invariants(snap, step)
    if obs.get("terminated") is False:
        raise LabCheckFailed("terminates", f"step {obs.get('steps', MAX_STEPS)}",
                             f"all requests finished within {MAX_STEPS} steps", f"{obs.get('unfinished')} unfinished",
                             "a request that never stops or is never readmitted")
    if obs.get("registered"):
        raise LabCheckFailed("nothing left registered", "after the last request finished, scheduler.requests",
                             "empty", obs["registered"], "a finished request is freed and forgotten: it leaves "
                             "scheduler.requests")
    pool = obs["snapshots"][-1]["pool"] if obs.get("snapshots") else None
    if "final_free" in obs and pool is not None and obs["final_free"] != pool - 1:
        raise LabCheckFailed("nothing leaked", "after the last request finished, free blocks", pool - 1,
                             obs["final_free"], "every finished (and preempted) request gives its blocks back")


def same_tokens(check: str, expected: list, got: list, hint: str) -> None:
    """LabCheckFailed at the first request and token where `got` differs from the reference."""
    if not isinstance(got, list) or len(got) != len(expected):
        raise LabCheckFailed(check, "outputs", f"{len(expected)} requests", repr(got)[:80], hint)
    for i, (e, g) in enumerate(zip(expected, got)):
        if g is None:
            raise LabCheckFailed(check, f"request {i}", "a finished output", "none", hint)
        for t, (a, b) in enumerate(zip(e, g)):
            if a != b:
                raise LabCheckFailed(check, f"request {i}, output token {t}", a, b, hint)
        if len(e) != len(g):
            raise LabCheckFailed(check, f"request {i}, number of output tokens", len(e), len(g), hint)
