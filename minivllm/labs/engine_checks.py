"""What the grader observes in the real engine: one in-process LLM per check run, its invariants after every step.

The engine runs in the caller's process (multiprocess=False) so a submission's function, patched in, is the
one the engine calls. Invariants after every step: token budget respected, each block held at most once per
request and ref_cnt equal to its holders, free + held == pool, queues consistent; after the last request
finishes: every block back in the pool.
"""
from __future__ import annotations

import contextlib

from minivllm.labs.errors import LabCheckFailed
from minivllm.request import RequestStatus
from minivllm.sampling_params import SamplingParams

PROMPTS = ["Once upon a time", "The capital of France is", "Hi there, how are you today?", "1, 2, 3, 4, 5,"]
_LLMS: dict = {}  # attention backend (None: the default) -> the shared engine
BACKEND = None  # the backend of the lab being graded (lab 5 grades on the PyTorch backend)


def get_llm():
    """One small engine per backend for the whole process: block_size 8, 12 blocks (small enough to preempt)."""
    if BACKEND not in _LLMS:
        from minivllm import LLM
        _LLMS[BACKEND] = LLM(multiprocess=False, block_size=8, num_gpu_blocks_override=12,
                             attention_backend=BACKEND)
    return _LLMS[BACKEND]


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


def check_invariants(sched, step: int, out) -> None:
    """Raise LabCheckFailed at the first broken invariant of the scheduler's state after `step`."""
    limit = sched.scheduler_config.max_num_batched_tokens
    if out is not None and out.total_num_scheduled_tokens > limit:
        raise LabCheckFailed("token budget", f"step {step}, total_num_scheduled_tokens", f"<= {limit}",
                             out.total_num_scheduled_tokens, "every scheduled token is taken from token_budget")
    kvm, pool = sched.kv_cache_manager, sched.kv_cache_manager.block_pool
    holders: dict[int, int] = {}
    for req_id, blocks in kvm.req_to_blocks.items():
        ids = [b.block_id for b in blocks]
        if len(set(ids)) != len(ids):
            raise LabCheckFailed("blocks owned once", f"step {step}, request {req_id}, block ids", "no repeats",
                                 ids, "a request holds each of its blocks once")
        for b in ids:
            holders[b] = holders.get(b, 0) + 1
    for block in pool.blocks[1:]:  # block 0 is the null block
        if block.ref_cnt != holders.get(block.block_id, 0):
            raise LabCheckFailed("blocks owned once", f"step {step}, block {block.block_id}, ref_cnt",
                                 holders.get(block.block_id, 0), block.ref_cnt,
                                 "a block's ref_cnt counts the requests whose block list holds it; "
                                 "blocks dropped without kv_cache_manager.free() keep theirs")
    held = sum(1 for b in pool.blocks[1:] if b.ref_cnt > 0)
    if pool.get_num_free_blocks() + held != pool.num_gpu_blocks - 1:
        raise LabCheckFailed("nothing leaked", f"step {step}, free + held blocks", pool.num_gpu_blocks - 1,
                             pool.get_num_free_blocks() + held, "every block is either free or held by a request")
    running, waiting = list(sched.running), list(sched.waiting)
    for req in running + waiting:
        if req.is_finished() or req.request_id not in sched.requests:
            raise LabCheckFailed("queues consistent", f"step {step}, request {req.request_id}, status",
                                 "unfinished and known to the scheduler", req.status.name,
                                 "a finished request leaves RUNNING and WAITING and scheduler.requests")
    if len({r.request_id for r in running + waiting}) != len(running) + len(waiting):
        raise LabCheckFailed("queues consistent", f"step {step}, queues", "each request in one queue once",
                             [r.request_id for r in running + waiting], "a preempted request leaves RUNNING")
    for req in running:
        if req.status != RequestStatus.RUNNING:
            raise LabCheckFailed("queues consistent", f"step {step}, request {req.request_id}, status", "RUNNING",
                                 req.status.name, "RUNNING holds only running requests")


def run(llm, prompts, params: SamplingParams, on_step=None) -> dict:
    """Drive the engine step by step, checking invariants; return {"tokens": [...], "steps", "preemptions",
    "victims": [(step, request index)]}."""
    engine, sched = llm.llm_engine, scheduler_of(llm)
    outputs_seen, original_schedule = [], sched.schedule

    def recording_schedule():
        out = original_schedule()
        outputs_seen.append(out)
        return out
    sched.schedule = recording_schedule
    preemptions0 = sched.num_preemptions
    try:
        ids = []
        for prompt in prompts:
            ids.append(engine.next_request_id())
            engine.add_request(ids[-1], prompt, params)
        finished, step = {}, 0
        while engine.has_unfinished_requests():
            step += 1
            if step > 400:
                raise LabCheckFailed("terminates", f"step {step}", "all requests finished within 400 steps",
                                     f"{sched.get_num_unfinished_requests()} unfinished",
                                     "a request that never stops or is never readmitted")
            for output in engine.step():
                if output.finished:
                    finished[output.request_id] = output
            check_invariants(sched, step, outputs_seen[-1] if outputs_seen else None)
            if on_step:
                on_step(sched, step, outputs_seen[-1] if outputs_seen else None)
        pool = sched.kv_cache_manager.block_pool
        if pool.get_num_free_blocks() != pool.num_gpu_blocks - 1:
            raise LabCheckFailed("nothing leaked", "after the last request finished, free blocks",
                                 pool.num_gpu_blocks - 1, pool.get_num_free_blocks(),
                                 "every finished (and preempted) request gives its blocks back")
    except Exception:
        ids and engine.has_unfinished_requests() and _abort(engine, ids)
        raise
    finally:
        sched.schedule = original_schedule
    victims = [(n, ids.index(r)) for n, out in enumerate(outputs_seen, 1) for r in sorted(out.preempted_req_ids)
               if r in ids]  # (step, request index) of every preemption
    return {"tokens": [list(finished[r].outputs[0].token_ids) if r in finished else None for r in ids],
            "steps": step, "preemptions": sched.num_preemptions - preemptions0, "victims": victims}


def _abort(engine, ids) -> None:
    with contextlib.suppress(Exception):
        engine.abort_request(ids)


def same_tokens(check: str, expected: list, got: list, hint: str) -> None:
    """LabCheckFailed at the first request and token where `got` differs from the reference."""
    for i, (e, g) in enumerate(zip(expected, got)):
        if g is None:
            raise LabCheckFailed(check, f"request {i}", "a finished output", "none", hint)
        for t, (a, b) in enumerate(zip(e, g)):
            if a != b:
                raise LabCheckFailed(check, f"request {i}, output token {t}", a, b, hint)
        if len(e) != len(g):
            raise LabCheckFailed(check, f"request {i}, number of output tokens", len(e), len(g), hint)


def drop_llm() -> None:
    """Forget the shared engine (after a failed check); the next get_llm() builds a fresh one."""
    llm = _LLMS.pop(BACKEND, None)
    if llm is not None:
        with contextlib.suppress(Exception):
            llm.shutdown()
