"""The labs' checks that run the engine: a scenario observed in the grading process, judged in the grader's.

`tokens_check(kind, hint)` is the common one: the scenario `kind` runs with the submission patched in, and its
snapshots and tokens are judged against the same scenario run with the engine's own functions. Labs 1 and 2
add their own observations (lab 1 drives the engine itself; lab 2 preempts a request by hand and looks at it).
"""
from __future__ import annotations

from minivllm.core.sched.scheduler import Scheduler
from minivllm.labs import engine_checks as ec
from minivllm.labs.errors import LabCheckFailed
from minivllm.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=10, temperature=0)
MUST_PREEMPT = {"preempted", "chunked-preempted"}  # scenarios whose reference run must preempt someone
# SmolLM2 answers "2 + 2 = 4" and ends with EOS (8 tokens, greedy): a request that finishes before max_tokens
EOS_PROMPT = "<|im_start|>user\nWhat is 2+2? Answer with a number only.<|im_end|>\n<|im_start|>assistant\n"


def scenario(kind: str, llm, obs: dict) -> dict:
    """Run one named scenario on `llm`, recording into `obs` (see engine_checks.run)."""
    preempting = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True)
    if kind == "greedy":
        return ec.run(llm, ec.PROMPTS[:2], GREEDY, obs)
    if kind == "chunked":
        with ec.budget(llm, 4):
            return ec.run(llm, ec.PROMPTS[:2], GREEDY, obs)
    if kind == "preempted":  # 4 requests of 19-25 tokens (13 blocks of 8) in 11 blocks: someone is preempted
        return ec.run(llm, ec.PROMPTS, preempting, obs)
    if kind == "chunked-preempted":  # the same under a budget of 6 tokens: chunks, and a preemption mid-way
        with ec.budget(llm, 6):
            return ec.run(llm, ec.PROMPTS, preempting, obs)
    if kind == "eos":  # one answer ends with EOS, the other runs to max_tokens
        return ec.run(llm, [EOS_PROMPT, ec.PROMPTS[0]], SamplingParams(max_tokens=20, temperature=0), obs)
    if kind == "shared-suffix":  # block X after block Y, then a prompt that starts with X: must not hit
        y, x = list(range(1000, 1008)), list(range(3000, 3008))
        first = ec.run(llm, [y + x + [5]], SamplingParams(max_tokens=4, temperature=0), {})
        obs["first_tokens"] = first.get("tokens")
        return ec.run(llm, [x + [5, 6]], SamplingParams(max_tokens=4, temperature=0), obs)
    if kind in ("swapped-blocks", "repeated"):  # X, Y and Y, Z cached; then Y, X (hits Y only) or X, Y (hits both)
        x, y, z = list(range(2000, 2008)), list(range(4000, 4008)), list(range(6000, 6008))
        ec.run(llm, [x + y + [5], y + z + [5]], SamplingParams(max_tokens=4, temperature=0), {})
        second = y + x + [5, 6] if kind == "swapped-blocks" else x + y + [5]
        return ec.run(llm, [second], SamplingParams(max_tokens=4, temperature=0), obs)
    if kind == "sampled":
        return ec.run(llm, ec.PROMPTS[:2], SamplingParams(max_tokens=8, temperature=1.0, top_k=5, top_p=0.6,
                                                          seed=7), obs)
    raise KeyError(kind)


def tokens_check(kind: str, hint: str, hits: str | None = None, steps: str | None = None):
    """(observe, judge): the scenario's invariants, its prefix-cache hits (when `hits` gives their hint), what each
    step scheduled and which blocks each request held after it (when `steps` gives their hint: a mistake that
    changes the work, e.g. the blocks a preempted request reuses, not the tokens), then its tokens equal to the
    reference's."""
    def observe(sub, llm, obs):
        scenario(kind, llm, obs)

    def judge(obs, ref):
        if kind in MUST_PREEMPT and not ref.get("preemptions"):
            raise RuntimeError(f"the grader's {kind} scenario preempted nothing: the grader itself needs fixing")
        if kind == "eos" and all(len(t) == 20 for t in ref["tokens"]):
            raise RuntimeError("the grader's eos scenario never met EOS: the grader itself needs fixing")
        ec.judge_run(obs)
        if hits is not None and obs.get("hits") != ref["hits"]:
            bad = next((i for i, (e, g) in enumerate(zip(ref["hits"], obs.get("hits") or [])) if e != g), 0)
            raise LabCheckFailed(f"{kind}: prefix-cache hits = reference", f"request {bad} (the second prompt), "
                                 "num_cached_tokens", ref["hits"][bad], (obs.get("hits") or [None])[bad], hits)
        if steps is not None:
            _same_steps(kind, ref, obs, steps)
        ec.same_tokens(f"{kind} tokens = reference", ref["tokens"], obs["tokens"], hint)
    return observe, judge


def _same_steps(kind: str, ref: dict, obs: dict, hint: str) -> None:
    for key, what in (("scheduled", "tokens scheduled"), ("held", "block ids held after the step")):
        for step, (exp, got) in enumerate(zip(ref[key], obs.get(key) or []), 1):
            if exp != got:
                exp, got = dict(map(tuple, exp)), dict(map(tuple, got))
                req = next(r for r in sorted(set(exp) | set(got)) if exp.get(r) != got.get(r))
                raise LabCheckFailed(f"{kind}: {what} = reference", f"step {step}, request {req}: {what}",
                                     exp.get(req, "none"), got.get(req, "none"), hint)


# -- lab 1 ------------------------------------------------------------------------------------------------
def _drive(sub, llm, obs, prompts, params, token_budget=None):
    """Run the submission's generate_loop on the engine (bounded in steps), recording what it returns."""
    engine = llm.llm_engine
    with ec.step_bound(engine, obs), ec.budget(llm, token_budget or ec.scheduler_of(llm).scheduler_config
                                               .max_num_batched_tokens):
        outs = sub["generate_loop"](engine, prompts, params)
    obs["is_list"], obs["repr"] = isinstance(outs, list), repr(outs)[:80]
    if obs["is_list"]:
        obs["tokens"] = [list(o.outputs[0].token_ids) if hasattr(o, "outputs") else None for o in outs]
        obs["prompts"] = [getattr(o, "prompt", None) for o in outs]
    obs["unfinished"] = bool(engine.has_unfinished_requests())
    return outs


def lab1_outputs_observe(sub, llm, obs):
    _drive(sub, llm, obs, ec.PROMPTS[:2], GREEDY)


def lab1_chunked_observe(sub, llm, obs):
    """A token budget of 4: every prompt is prefilled in chunks, over more steps than max_tokens."""
    _drive(sub, llm, obs, ec.PROMPTS[:2], GREEDY, token_budget=4)


def _judge_step_limit(obs):
    if "step_limit" in obs:
        raise LabCheckFailed("terminates", "engine.step() calls", f"at most {obs['step_limit']}",
                             "more (the grader stopped the loop)", "loop while the engine has unfinished requests, "
                             "and no longer")


def _lab1_judge(check: str, hint: str):
    def judge(obs, ref):
        _judge_step_limit(obs)
        if not obs["is_list"] or len(obs["tokens"]) != len(ref["tokens"]):
            raise LabCheckFailed("one output per prompt", "return value", f"a list of {len(ref['tokens'])} "
                                 "RequestOutputs", obs["repr"], "keep every finished output, in prompt order")
        if obs["unfinished"]:
            raise LabCheckFailed("nothing left running", "after generate_loop", "no unfinished requests",
                                 "some unfinished", "loop while the engine has unfinished requests: a step count "
                                 "fixed in advance (prompts, max_tokens) is not enough once prefill is chunked")
        ec.same_tokens(check, ref["tokens"], obs["tokens"], hint)
    return judge


lab1_outputs_judge = _lab1_judge("greedy tokens = LLM.generate", "step until has_unfinished_requests() is False "
                                 "and keep each request's output once it is finished (not its first one)")
lab1_chunked_judge = _lab1_judge("chunked tokens = LLM.generate", "a prefill may take several steps: loop on "
                                 "has_unfinished_requests(), never on a step count")


def lab1_order_observe(sub, llm, obs):
    """The first prompt runs to max_tokens, the second ends early with EOS: they finish in the other order."""
    finished = []
    with ec.on_step(llm.llm_engine, lambda outs: finished.extend(o.prompt for o in outs if o.finished)):
        _drive(sub, llm, obs, [ec.PROMPTS[0], EOS_PROMPT], SamplingParams(max_tokens=24, temperature=0))
    obs["finish_order"] = finished


def lab1_order_judge(obs, ref):
    if ref["finish_order"] == ref["prompts"]:
        raise RuntimeError("lab 1's order scenario finished in prompt order: the grader itself needs fixing")
    _judge_step_limit(obs)
    if obs.get("prompts") != ref["prompts"]:
        hint = ("you returned them in the order they finished; return them in the order the prompts came"
                if obs.get("prompts") == ref["finish_order"] else "one output per prompt, in prompt order")
        raise LabCheckFailed("outputs in prompt order", "RequestOutput.prompt of each returned output",
                             ref["prompts"], obs.get("prompts", obs["repr"]), hint)


# -- lab 2 ------------------------------------------------------------------------------------------------
def lab2_victim_state_observe(sub, llm, obs):
    """Preempt a running request by hand and look at it: blocks freed, progress reset, head of WAITING."""
    engine, sched = llm.llm_engine, ec.scheduler_of(llm)
    ids = [engine.next_request_id() for _ in range(3)]
    engine.add_request(ids[0], ec.PROMPTS[0], GREEDY)
    engine.add_request(ids[1], ec.PROMPTS[1], GREEDY)
    engine.step()
    engine.add_request(ids[2], ec.PROMPTS[2], GREEDY)  # waits behind the victim
    victim = sched.running.pop()
    obs.update(victim=victim.request_id, free_before=sched.kv_cache_manager.block_pool.get_num_free_blocks(),
               n_blocks=len(sched.kv_cache_manager.get_block_ids(victim.request_id)))
    Scheduler._preempt_request(sched, victim)
    head = sched.waiting.peek_request() if len(sched.waiting) else None
    obs.update(status=victim.status.name, num_computed_tokens=int(victim.num_computed_tokens),
               free_after=sched.kv_cache_manager.block_pool.get_num_free_blocks(), head_is_victim=head is victim,
               head=None if head is None else head.request_id)
    steps = 0  # the grader's own loop is bounded too
    while engine.has_unfinished_requests() and steps < ec.MAX_STEPS:
        engine.step()
        steps += 1
    obs["terminated"] = not engine.has_unfinished_requests()


def lab2_victim_state_judge(obs, ref):
    where = f"request {obs['victim']} after _preempt_request"
    if obs["status"] != "PREEMPTED":
        raise LabCheckFailed("victim state", f"{where}, status", "PREEMPTED", obs["status"],
                             "mark the request as preempted")
    if obs["num_computed_tokens"] != 0:
        raise LabCheckFailed("victim state", f"{where}, num_computed_tokens", 0, obs["num_computed_tokens"],
                             "recompute: its KV is gone, so none of its tokens count as computed")
    if obs["free_after"] != obs["free_before"] + obs["n_blocks"]:
        raise LabCheckFailed("victim state", f"{where}, free blocks", obs["free_before"] + obs["n_blocks"],
                             obs["free_after"], "preemption exists to give the victim's blocks back")
    if not obs["head_is_victim"]:
        raise LabCheckFailed("victim first in WAITING", f"{where}, head of WAITING", obs["victim"], obs["head"],
                             "a preempted request must not wait behind newer ones")
    if not obs["terminated"]:
        raise LabCheckFailed("terminates", "after the preemption", f"every request finished within {ec.MAX_STEPS} "
                             "steps", "some still unfinished", "a preempted request must be readmitted and finish")


def lab2_preempted_observe(sub, llm, obs):
    scenario("preempted", llm, obs)


def lab2_preempted_judge(obs, ref):
    """The preempted scenario: the reference's tokens, and the same victims (FCFS preempts LIFO)."""
    if not ref.get("preemptions"):
        raise RuntimeError("the grader's preempted scenario preempted nothing: the grader itself needs fixing")
    ec.judge_run(obs)
    ec.same_tokens("preempted tokens = reference", ref["tokens"], obs["tokens"], "a resumed request recomputes from 0")
    expected, got = ref["victims"], obs["victims"]
    n = max(len(expected), len(got))
    for k, (e, g) in enumerate(zip(expected + [None] * (n - len(expected)), got + [None] * (n - len(got)))):
        if e != g:
            show = lambda v: "no preemption" if v is None else f"step {v[0]}: request {v[1]}"  # noqa: E731
            raise LabCheckFailed("victim = the latest admitted", f"preemption {k} (request = prompt index)",
                                 show(e), show(g), "with FCFS the victim is taken from the tail of RUNNING")
