"""Unit checks of lab 11 (the token budget of one step), without an engine: Scheduler._num_new_tokens on requests
built by hand, each case one rule at its boundary, budgets of 2 to 64 tokens (4, 8 and 16 for the same chunk).

A case is a real Scheduler (no model) with the case's configuration and a Request whose num_tokens, num_computed_tokens
and drafts are set by hand; the submission's answer is compared with the engine's own function on the same case.
"""
from __future__ import annotations

import numbers

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.sched.scheduler import Scheduler
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.request import Request
from minivllm.sampling_params import SamplingParams

_DRAFTS = "a running request's drafts are tokens to compute: catch up to num_tokens_with_spec, not num_tokens"
_BUDGET = "never more than token_budget: what is left of the step's budget is the last clamp"
_MODEL_LEN = ("computed + new <= max_model_len - 1: position max_model_len - 1 is sampled, never fed back, so no "
              "token or draft is scheduled there")
_WHOLE = "without chunked prefill a prompt comes in whole or not at all: 0 when its rest does not fit token_budget"
_THRESHOLD = "long_prefill_token_threshold caps a step's tokens only when chunked prefill is on"
# (label, (chunked prefill, threshold, max_model_len), prompt, outputs, computed, drafts, budget, hit or None, hint)
RUNNING = [("a decode", (True, 0, 8192), 9, 3, 11, 0, 64, None, "a decode catches up by its one new token"),
           ("a decode with 3 drafts", (True, 0, 8192), 9, 3, 11, 3, 64, None, _DRAFTS),
           ("a decode with 3 drafts, budget 2", (True, 0, 8192), 9, 3, 11, 3, 2, None, _BUDGET),
           *[(f"a prefill chunk, budget {b}", (True, 0, 8192), 37, 0, 16, 0, b, None, _BUDGET) for b in (4, 8, 16)],
           ("3 drafts, two positions from max_model_len", (True, 0, 24), 17, 4, 20, 3, 64, None, _MODEL_LEN),
           ("a draft, one position from max_model_len", (True, 0, 24), 17, 6, 22, 1, 64, None, _MODEL_LEN),
           ("a prefill chunk under a threshold of 6", (True, 6, 8192), 37, 0, 8, 0, 64, None,
            "with chunked prefill on, long_prefill_token_threshold caps a step's tokens"),
           ("chunked prefill off: drafts still within budget 2", (False, 0, 64), 9, 3, 11, 3, 2, None, _BUDGET)]
ADMIT = [("after a prefix-cache hit of 48", (True, 0, 8192), 55, 0, 0, 0, 64, 48,
          "being admitted, a request starts at its hit (the num_computed_tokens argument), not at 0"),
         *[(f"a prompt longer than budget {b}, chunked", (True, 0, 8192), 37, 0, 0, 0, b, 0, _BUDGET)
           for b in (4, 8, 16)],
         ("a threshold of 8, chunked", (True, 8, 8192), 37, 0, 0, 0, 64, 0, "with chunked prefill on, "
          "long_prefill_token_threshold caps a step's tokens"),
         ("no chunked prefill: the prompt fits", (False, 0, 64), 21, 0, 0, 0, 24, 0, _WHOLE),
         ("no chunked prefill: the prompt does not fit", (False, 0, 64), 21, 0, 0, 0, 16, 0, _WHOLE),
         ("no chunked prefill, a threshold of 8", (False, 8, 64), 21, 0, 0, 0, 24, 0, _THRESHOLD),
         ("readmitted after preemption, hit 8", (True, 0, 8192), 9, 5, 0, 0, 64, 8, "a preempted request catches up "
          "on its prompt and its outputs (num_tokens) from its hit"),
         ("no chunked prefill: the rest after a hit of 16 fits", (False, 0, 64), 21, 0, 0, 0, 8, 16, _WHOLE)]


def _case(case) -> tuple:
    """(scheduler, request, token_budget, num_computed_tokens argument) of one case."""
    _, (chunked, threshold, max_model_len), prompt, outputs, computed, drafts, budget, hit, _ = case
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8192, max_model_len=max_model_len,
                                      enable_chunked_prefill=chunked, long_prefill_token_threshold=threshold),
                      CacheConfig(block_size=16, num_gpu_blocks=8))
    request = Request("r", list(range(3, 3 + prompt)), SamplingParams(max_tokens=None, temperature=0), 2)
    for t in range(outputs):
        request.append_output_token_ids(100 + t)
    request.num_computed_tokens = computed
    request.spec_token_ids = list(range(200, 200 + drafts))
    return sched, request, budget, hit


def _observe(cases):
    @unit
    def observe(sub, llm, obs):
        obs["new"] = []
        for case in cases:
            sched, request, budget, hit = _case(case)
            got = (sub["_num_new_tokens"](sched, request, budget) if hit is None else
                   sub["_num_new_tokens"](sched, request, budget, hit))
            whole = isinstance(got, numbers.Integral) and not isinstance(got, bool)
            obs["new"].append(int(got) if whole else f"{type(got).__name__} {repr(got)[:60]}")
    return observe


def _judge(check: str, cases):
    def judge(obs, ref):
        for case, exp, got in zip(cases, ref["new"], obs["new"]):
            label, (chunked, threshold, max_model_len), prompt, outputs, computed, drafts, budget, hit, hint = case
            if got == exp:
                continue
            state = (f"num_computed_tokens {computed}, {drafts} drafts" if hit is None else
                     f"being admitted after a hit of {hit}")
            where = (f"{label}: {prompt}-token prompt + {outputs} outputs, {state}, token_budget {budget}; chunked "
                     f"prefill {'on' if chunked else 'off'}, threshold {threshold}, max_model_len {max_model_len}")
            raise LabCheckFailed(check, where, exp, got, hint if isinstance(got, int) else "return an int")
    return judge


lab11_running_observe, lab11_running_judge = _observe(RUNNING), _judge("running: drafts, budget, max_model_len",
                                                                       RUNNING)
lab11_admit_observe, lab11_admit_judge = _observe(ADMIT), _judge("admission: the hit, threshold, whole or nothing",
                                                                 ADMIT)
