"""The labs: which exercise file, which engine attribute each function replaces, and the graded checks.

A check is `fn(sub, llm)`: `sub` maps function names to the submission's functions (already patched into the
engine while the check runs), `llm` is the shared in-process engine. It returns nothing or raises
LabCheckFailed; the reference engine's own tokens (computed with nothing patched) are the expected values.
"""
from __future__ import annotations

import dataclasses
import functools


from minivllm.attention import layer as attention_layer
from minivllm.attention.backends import torch_attn
from minivllm.core import kv_cache_utils
from minivllm.core.sched import scheduler as scheduler_module
from minivllm.core.sched.scheduler import Scheduler
from minivllm.labs import engine_checks as ec
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import _lab3_packing, _lab4_context, _lab5_unit, _lab6_stops, _lab7_chain, _lab8_masks
from minivllm.request import RequestStatus
from minivllm.sample import sampler as sampler_module
from minivllm.sampling_params import SamplingParams
from minivllm.worker import gpu_model_runner

GREEDY = SamplingParams(max_tokens=10, temperature=0)


@dataclasses.dataclass
class Lab:
    id: int
    title: str
    module: str  # exercise file name without .py
    functions: list[str]
    targets: dict  # function name -> [(object, attribute)] the grader patches
    checks: list  # [(check name, fn(sub, llm))]
    minutes: str
    scenarios: tuple = ()  # reference runs the checks compare with, computed before anything is patched
    backend: str | None = None  # the attention backend the lab's engine runs
    # engine functions the checks cover that the student does not write (only a fault replaces them): name -> ours
    fixed: dict = dataclasses.field(default_factory=dict)


def reference(kind: str) -> list:
    """The reference engine's tokens for one scenario, computed once per process with nothing patched."""
    return _reference(kind, ec.BACKEND)["tokens"]


@functools.lru_cache(maxsize=None)
def _reference(kind: str, backend) -> dict:
    result = _scenario(kind)
    if kind == "preempted" and result["preemptions"] == 0:
        raise RuntimeError("the grader's preempted scenario preempted nothing: the grader itself needs fixing")
    return result


def _scenario(kind: str, on_step=None) -> dict:
    llm = ec.get_llm()
    if kind == "greedy":
        return ec.run(llm, ec.PROMPTS[:2], GREEDY, on_step)
    if kind == "chunked":
        with ec.budget(llm, 4):
            return ec.run(llm, ec.PROMPTS[:2], GREEDY, on_step)
    if kind == "preempted":  # 4 requests of 19-25 tokens (13 blocks of 8) in 11 blocks: someone is preempted
        return ec.run(llm, ec.PROMPTS, SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), on_step)
    if kind == "eos":  # long enough for SmolLM2 to end one answer with EOS
        return ec.run(llm, ["<|im_start|>user\nSay hi.<|im_end|>\n<|im_start|>assistant\n"],
                      SamplingParams(max_tokens=30, temperature=0), on_step)
    if kind == "shared-suffix":  # block X after block Y, then a prompt that starts with X: must not hit
        y, x = list(range(1000, 1008)), list(range(3000, 3008))
        return ec.run(llm, [y + x + [5]], SamplingParams(max_tokens=4, temperature=0), on_step)["tokens"] and \
            ec.run(llm, [x + [5, 6]], SamplingParams(max_tokens=4, temperature=0), on_step)
    if kind == "sampled":
        return ec.run(llm, ec.PROMPTS[:2], SamplingParams(max_tokens=8, temperature=1.0, top_k=5, top_p=0.6,
                                                          seed=7), on_step)
    raise KeyError(kind)


def tokens_check(kind: str, hint: str):
    def check(sub, llm):
        expected = reference(kind)
        ec.same_tokens(f"{kind} tokens = reference", expected, _scenario(kind)["tokens"], hint)
    return check


# -- lab 1 ------------------------------------------------------------------------------------------------
def _lab1_outputs(sub, llm):
    outs = sub["generate_loop"](llm.llm_engine, ec.PROMPTS[:2], GREEDY)
    if not isinstance(outs, list) or len(outs) != 2:
        raise LabCheckFailed("one output per prompt", "return value", "a list of 2 RequestOutputs",
                             repr(outs)[:80], "keep every finished output, in prompt order")
    ec.same_tokens("greedy tokens = LLM.generate", reference("greedy"),
                   [list(o.outputs[0].token_ids) if o is not None else None for o in outs],
                   "step until has_unfinished_requests() is False and keep each finished output")
    if llm.llm_engine.has_unfinished_requests():
        raise LabCheckFailed("nothing left running", "after generate_loop", "no unfinished requests",
                             "some unfinished", "loop while the engine has unfinished requests")


def _lab1_order(sub, llm):
    outs = sub["generate_loop"](llm.llm_engine, [ec.PROMPTS[2], ec.PROMPTS[0]], GREEDY)
    if [o.prompt for o in outs] != [ec.PROMPTS[2], ec.PROMPTS[0]]:
        raise LabCheckFailed("outputs in prompt order", "RequestOutput.prompt", [ec.PROMPTS[2], ec.PROMPTS[0]],
                             [o.prompt for o in outs], "requests finish in any order; return them as submitted")


# -- lab 2 ------------------------------------------------------------------------------------------------
def _lab2_victim_state(sub, llm):
    """Preempt a running request by hand and look at it: blocks freed, progress reset, head of WAITING."""
    engine, sched = llm.llm_engine, ec.scheduler_of(llm)
    ids = [engine.next_request_id() for _ in range(3)]
    try:
        engine.add_request(ids[0], ec.PROMPTS[0], GREEDY)
        engine.add_request(ids[1], ec.PROMPTS[1], GREEDY)
        engine.step()
        engine.add_request(ids[2], ec.PROMPTS[2], GREEDY)  # waits behind the victim
        victim = sched.running.pop()
        free_before = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        n_blocks = len(sched.kv_cache_manager.get_block_ids(victim.request_id))
        Scheduler._preempt_request(sched, victim)
        where = f"request {victim.request_id} after _preempt_request"
        if victim.status != RequestStatus.PREEMPTED:
            raise LabCheckFailed("victim state", f"{where}, status", "PREEMPTED", victim.status.name,
                                 "mark the request as preempted")
        if victim.num_computed_tokens != 0:
            raise LabCheckFailed("victim state", f"{where}, num_computed_tokens", 0, victim.num_computed_tokens,
                                 "recompute: its KV is gone, so none of its tokens count as computed")
        free_after = sched.kv_cache_manager.block_pool.get_num_free_blocks()
        if free_after != free_before + n_blocks:
            raise LabCheckFailed("victim state", f"{where}, free blocks", free_before + n_blocks, free_after,
                                 "preemption exists to give the victim's blocks back")
        head = sched.waiting.peek_request()
        if head is not victim:
            raise LabCheckFailed("victim first in WAITING", f"{where}, head of WAITING", victim.request_id,
                                 head.request_id, "a preempted request must not wait behind newer ones")
        while engine.has_unfinished_requests():
            engine.step()
    finally:
        if engine.has_unfinished_requests():
            ec._abort(engine, ids)


def _lab2_preempted(sub, llm):
    """The preempted scenario: the reference's tokens, and the same victims (FCFS preempts LIFO)."""
    result = _scenario("preempted")
    ec.same_tokens("preempted tokens = reference", reference("preempted"), result["tokens"],
                   "a resumed request recomputes from 0")
    expected, got = _reference("preempted", ec.BACKEND)["victims"], result["victims"]
    n = max(len(expected), len(got))
    for k, (e, g) in enumerate(zip(expected + [None] * (n - len(expected)), got + [None] * (n - len(got)))):
        if e != g:
            show = lambda v: "no preemption" if v is None else f"step {v[0]}: request {v[1]}"  # noqa: E731
            raise LabCheckFailed("victim = the latest admitted", f"preemption {k} (request = prompt index)",
                                 show(e), show(g), "with FCFS the victim is taken from the tail of RUNNING")


LABS = {
    1: Lab(1, "the generate loop: add_request, then step() until nothing is unfinished", "lab01_generate_loop",
           ["generate_loop"], {}, [("greedy tokens = LLM.generate", _lab1_outputs),
                                   ("outputs in prompt order", _lab1_order)], "20", ("greedy",)),
    2: Lab(2, "preemption by recompute: Scheduler._preempt_request", "lab02_preemption", ["_preempt_request"],
           {"_preempt_request": [(Scheduler, "_preempt_request")], "_num_new_tokens": [(Scheduler, "_num_new_tokens")],
            "_select_victim": [(Scheduler, "_select_victim")]},
           [("victim state", _lab2_victim_state),
            ("preempted tokens and victims = reference", _lab2_preempted),
            ("chunked tokens = reference", tokens_check("chunked", "chunked prefill must not change tokens"))],
           "30", ("preempted", "chunked"), fixed={"_num_new_tokens": Scheduler._num_new_tokens,
                                                  "_select_victim": Scheduler._select_victim}),
    3: Lab(3, "input packing: positions, query_start_loc, slot_mapping, logits_indices (pack_indices)",
           "lab03_input_packing", ["pack_indices"], {"pack_indices": [(gpu_model_runner, "pack_indices")]},
           [("indices = formula", lambda sub, llm: _lab3_packing(sub)),
            ("greedy tokens = reference", tokens_check("greedy", "a decode row sits after the request's history")),
            ("chunked tokens = reference", tokens_check("chunked", "a later chunk continues where the last ended"))],
           "30", ("greedy", "chunked")),
    4: Lab(4, "the forward context: get_attention_context(layer_name)", "lab04_forward_context",
           ["get_attention_context"], {"get_attention_context": [(attention_layer, "get_attention_context")]},
           [("context of the named layer", lambda sub, llm: _lab4_context(sub)),
            ("greedy tokens = reference", tokens_check("greedy", "each layer reads back the K/V it wrote")),
            ("chunked tokens = reference", tokens_check("chunked", "each layer keeps its own history"))],
           "20", ("greedy", "chunked")),
    6: Lab(6, "the stop check and reclamation: check_stop, Scheduler._free_request", "lab06_stop_and_free",
           ["check_stop", "_free_request"],
           {"check_stop": [(scheduler_module, "check_stop")], "_free_request": [(Scheduler, "_free_request")]},
           [("greedy tokens = reference", tokens_check("greedy", "max_tokens counts output tokens; stop when reached")),
            ("EOS and stop_token_ids stop", lambda sub, llm: _lab6_stops(sub)),
            ("preempted tokens = reference", tokens_check("preempted", "freed blocks go to the waiting requests"))],
           "30", ("greedy", "preempted")),
    7: Lab(7, "prefix caching: the chained block hash hash_block_tokens", "lab07_block_hash", ["hash_block_tokens"],
           {"hash_block_tokens": [(kv_cache_utils, "hash_block_tokens")]},
           [("hash is chained", lambda sub, llm: _lab7_chain(sub)),
            ("shared suffix, different prefix: no hit", tokens_check("shared-suffix",
                                                                     "a block's name must cover its whole prefix")),
            ("greedy tokens = reference", tokens_check("greedy", "equal prefixes must hash equal"))], "20",
           ("shared-suffix", "greedy")),
    5: Lab(5, "the paged KV cache: the write by slot_mapping and the read by block_table", "lab05_paged_kv",
           ["do_kv_cache_update", "gather_blocks"],
           {"do_kv_cache_update": [(torch_attn.TorchAttentionImpl, "do_kv_cache_update")],
            "gather_blocks": [(torch_attn, "gather_blocks")]},
           [("write and read = formula", lambda sub, llm: _lab5_unit(sub)),
            ("greedy tokens = reference", tokens_check("greedy", "K/V must be read back where they were written")),
            ("chunked tokens = reference", tokens_check("chunked", "a later chunk reads the earlier chunks' KV")),
            ("preempted tokens = reference", tokens_check("preempted", "block ids are physical, any order"))],
           "40", ("greedy", "chunked", "preempted"), "torch"),
    8: Lab(8, "sampling: top-k and top-p, apply_top_k_top_p", "lab08_top_k_top_p", ["apply_top_k_top_p"],
           {"apply_top_k_top_p": [(sampler_module, "apply_top_k_top_p")]},
           [("masks = formula", lambda sub, llm: _lab8_masks(sub)),
            ("seeded sampled tokens = reference", tokens_check("sampled", "top-k then top-p on the sorted row"))],
           "40", ("sampled",)),
}

LABS = dict(sorted(LABS.items()))  # lab number order for list and grade
