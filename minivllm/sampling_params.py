"""Mirror of vllm/sampling_params.py: the per-request knobs of generation.

SamplingParams validates itself on construction, so a bad value fails where the
user typed it, with the name of the field to change. Types are strict as in
vLLM's msgspec struct: a bool is not an int, a string is not a bool, NaN is no
number. Left out: beam search, guided decoding, logits processors, penalties, n > 1.
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field

SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts


def is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) means the whole vocabulary; above the vocabulary size, the same
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0  # EOS and stop_token_ids are masked, stop strings unchecked, until this many exist
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many top alternatives; -1: the whole vocabulary
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) in `text`
    # EOS (unless ignore_eos) plus stop_token_ids: set at submission, what min_tokens masks
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if isinstance(self.stop, (list, tuple)) else self.stop or []
        if isinstance(self.stop_token_ids, (list, tuple)) or self.stop_token_ids is None:
            self.stop_token_ids = list(self.stop_token_ids or [])
        self._verify()
        if self.top_k == -1:
            self.top_k = 0
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify(self) -> None:
        def bad(name: str, want: str) -> None:
            raise ValueError(f"SamplingParams.{name} must be {want}, got {getattr(self, name)!r}.")

        if not is_number(self.temperature) or self.temperature < 0:
            bad("temperature", "a finite number >= 0 (0 means greedy)")
        if not is_number(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "a number in (0, 1]")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "an int >= 0 (0 or -1 disables it)")
        if not is_number(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "a number in [0, 1]")
        if self.seed is not None and not (is_int(self.seed) and SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            bad("seed", "an int in [-2**63, 2**64 - 1] or None")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", "an int >= 1 or None")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "a string or a list of non-empty strings")
        if not isinstance(self.stop_token_ids, list) or not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids (ints >= 0)")
        if self.logprobs is not None and (not is_int(self.logprobs) or self.logprobs < -1):
            bad("logprobs", "an int >= 0, -1 for the whole vocabulary, or None")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    def update_from_tokenizer(self, eos_token_id: int | None) -> None:
        """At submission (on the engine's own copy): EOS joins the ids that min_tokens holds back."""
        if eos_token_id is not None and not self.ignore_eos:
            self._all_stop_token_ids.add(eos_token_id)
