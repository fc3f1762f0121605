"""Mirror of vllm/config/speculative.py: SpeculativeConfig, the `speculative_config` engine argument checked.

`LLM(speculative_config={"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
"prompt_lookup_min": 2})`, `--speculative-config '{...}'` on the command line. Only the n-gram method (prompt
lookup: drafts copied from the request's own tokens, no draft model) is built; vLLM's draft-model, EAGLE, Medusa
and MTP methods are not. As vLLM: prompt_lookup_min defaults to prompt_lookup_max and the other way round,
5 when neither is given (vLLM's default max); both are ints >= 1, min <= max, and prompt_lookup_max has no upper
bound (vLLM sets none): a value past the context only means no n-gram is too long to look up, and the proposer's
cost stays linear in the context whatever it is (ngram_proposer.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from minivllm.utils.math_utils import is_int

KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min")


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # k: the most draft tokens a request carries into one step
    prompt_lookup_max: int  # the longest suffix n-gram looked up
    prompt_lookup_min: int  # the shortest

    @classmethod
    def from_dict(cls, d: dict) -> "SpeculativeConfig":
        """Validate the user's dict; every mistake is a ValueError naming the key and the fix."""
        if not isinstance(d, dict):
            raise ValueError(f"speculative_config must be a dict (JSON object), got {type(d).__name__}")
        unknown = sorted(set(d) - set(KEYS))
        if unknown:
            raise ValueError(f"speculative_config has unknown keys {unknown}: minivllm takes {list(KEYS)}")
        method = d.get("method", "ngram")
        if method != "ngram":
            raise ValueError(f"speculative_config method {method!r} is not built here: use 'ngram' (prompt lookup); "
                             f"draft models, EAGLE, Medusa and MTP are vLLM-only")
        k = d.get("num_speculative_tokens")
        if not is_int(k) or not 1 <= k <= 32:
            raise ValueError(f"speculative_config needs num_speculative_tokens, an int in 1..32, got {k!r}")
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        for name, value in (("prompt_lookup_min", lo), ("prompt_lookup_max", hi)):
            if value is not None and (not is_int(value) or value < 1):
                raise ValueError(f"speculative_config {name} must be an int >= 1, got {value!r}")
        hi = hi if hi is not None else (lo if lo is not None else 5)
        lo = lo if lo is not None else hi
        if lo > hi:
            raise ValueError(f"speculative_config prompt_lookup_min ({lo}) must not exceed prompt_lookup_max ({hi})")
        return cls(method, k, hi, lo)


def num_spec_tokens_to_schedule(num_speculative_tokens: int, num_reqs: int, max_verify_tokens: int | None) -> int:
    """How many drafts each request may carry into the next step (vLLM's `num_spec_tokens_to_schedule`).

    A step verifying d drafts per request runs num_reqs * (d + 1) tokens through the model. Where that many rows
    still cost about one pass over the weights (a GPU, or a CPU at a few requests) drafts are nearly free and every
    request carries k; where the step is already compute-bound each draft costs about what a plain step's token
    does, and a rejected one is lost. So the drafts shrink as the batch grows: the most d <= k with
    num_reqs * (d + 1) <= max_verify_tokens, down to none (plain decode steps). None keeps k always (vLLM's
    static k). minivllm's default (envs.spec_max_verify_tokens) is a bound on the CPU, none on a GPU; vLLM's
    newest release picks k per step from a per-batch-size profile instead.
    """
    if max_verify_tokens is None:
        return num_speculative_tokens
    return max(0, min(num_speculative_tokens, max_verify_tokens // max(num_reqs, 1) - 1))
