"""Mirror of vllm/sampling_params.py: the per-request knobs of generation.

SamplingParams validates itself on construction, so a bad value fails where the
user typed it, with the name of the field to change. Left out: beam search,
guided decoding, logits processors, penalties, n > 1.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) means the whole vocabulary
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many top alternatives
    skip_special_tokens: bool = True

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop or [])
        self.stop_token_ids = list(self.stop_token_ids or [])
        if self.top_k == -1:
            self.top_k = 0
        self._verify()

    def _verify(self) -> None:
        def bad(name: str, want: str) -> None:
            raise ValueError(f"SamplingParams.{name} must be {want}, got {getattr(self, name)!r}.")

        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            bad("temperature", "a number >= 0 (0 means greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", "in (0, 1]")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            bad("top_k", "an int >= 0 (0 or -1 disables it)")
        if not isinstance(self.min_p, (int, float)) or not 0 <= self.min_p <= 1:
            bad("min_p", "in [0, 1]")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "an int or None")
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad("max_tokens", "an int >= 1 or None")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            bad("min_tokens", "an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "a list of non-empty strings")
        if not all(isinstance(t, int) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids >= 0")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            bad("logprobs", "an int >= 0 or None")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
