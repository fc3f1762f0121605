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
    if kind == "eos":  # long enough for SmolLM2 to end one answer with EOS
        return ec.run(llm, ["<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"],
                      SamplingParams(max_tokens=30, temperature=0), obs)
    if kind == "shared-suffix":  # block X after block Y, then a prompt that starts with X: must not hit
        y, x = list(range(1000, 1008)), list(range(3000, 3008))
        first = ec.run(llm, [y + x + [5]], SamplingParams(max_tokens=4, temperature=0), {})
        obs["first_tokens"] = first.get("tokens")
        return ec.run(llm, [x + [5, 6]], SamplingParams(max_tokens=4, temperature=0), obs)
    if kind == "sampled":
        return ec.run(llm, ec.PROMPTS[:2], SamplingParams(max_tokens=8, temperature=1.0, top_k=5, top_p=0.6,
                                                          seed=7), obs)
    raise KeyError(kind)


def tokens_check(kind: str, hint: str):
    """(observe, judge): the scenario's invariants, then its tokens equal to the reference's."""
    def observe(sub, llm, obs):
        scenario(kind, llm, obs)

    def judge(obs, ref):
        if kind in MUST_PREEMPT and not ref.get("preemptions"):
            raise RuntimeError(f"the grader's {kind} scenario preempted nothing: the grader itself needs fixing")
        ec.judge_run(obs)
        ec.same_tokens(f"{kind} tokens = reference", ref["tokens"], obs["tokens"], hint)
    return observe, judge


# -- lab 1 ------------------------------------------------------------------------------------------------
def lab1_outputs_observe(sub, llm, obs):
    engine = llm.llm_engine
    with ec.step_bound(engine, obs):
        outs = sub["generate_loop"](engine, ec.PROMPTS[:2], GREEDY)
    obs["is_list"], obs["repr"] = isinstance(outs, list), repr(outs)[:80]
    if obs["is_list"]:
        obs["tokens"] = [list(o.outputs[0].token_ids) if o is not None else None for o in outs]
    obs["unfinished"] = bool(engine.has_unfinished_requests())


def _judge_step_limit(obs):
    if "step_limit" in obs:
        raise LabCheckFailed("terminates", "engine.step() calls", f"at most {obs['step_limit']}",
                             "more (the grader stopped the loop)", "loop while the engine has unfinished requests, "
                             "and no longer")


def lab1_outputs_judge(obs, ref):
    _judge_step_limit(obs)
    if not obs["is_list"] or len(obs["tokens"]) != len(ref["tokens"]):
        raise LabCheckFailed("one output per prompt", "return value", "a list of 2 RequestOutputs", obs["repr"],
                             "keep every finished output, in prompt order")
    ec.same_tokens("greedy tokens = LLM.generate", ref["tokens"], obs["tokens"],
                   "step until has_unfinished_requests() is False and keep each finished output")
    if obs["unfinished"]:
        raise LabCheckFailed("nothing left running", "after generate_loop", "no unfinished requests",
                             "some unfinished", "loop while the engine has unfinished requests")


def lab1_order_observe(sub, llm, obs):
    with ec.step_bound(llm.llm_engine, obs):
        outs = sub["generate_loop"](llm.llm_engine, [ec.PROMPTS[2], ec.PROMPTS[0]], GREEDY)
    obs["prompts"] = [getattr(o, "prompt", None) for o in outs] if isinstance(outs, list) else repr(outs)[:80]


def lab1_order_judge(obs, ref):
    _judge_step_limit(obs)
    if obs["prompts"] != ref["prompts"]:
        raise LabCheckFailed("outputs in prompt order", "RequestOutput.prompt", ref["prompts"], obs["prompts"],
                             "requests finish in any order; return them as submitted")


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
