"""Mirror of vllm/v1/spec_decode/metrics.py: SpecDecodingStats, kept cumulative by the scheduler.

As vLLM's counters: drafts verified (requests-steps that carried drafts), draft tokens, accepted draft tokens,
accepted tokens per draft position (position 0 accepted in how many drafts, position 1, ...) and draft tokens
per position (how many drafts reached position 0, 1, ...: n-gram drafts are often shorter than k); the acceptance
rate is accepted / draft tokens, the mean accepted length 1 + accepted / drafts (the bonus or replacement
token always comes). Unlike vLLM, which makes a new one each step, the scheduler keeps one for the engine's life.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SpecDecodingStats:
    num_spec_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: list[int] = field(default_factory=list)
    num_draft_tokens_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:  # unlike vLLM, where only new() sizes them: the lists come zeroed either way
        self.num_accepted_tokens_per_pos = self.num_accepted_tokens_per_pos or [0] * self.num_spec_tokens
        self.num_draft_tokens_per_pos = self.num_draft_tokens_per_pos or [0] * self.num_spec_tokens

    @classmethod
    def new(cls, num_spec_tokens: int) -> "SpecDecodingStats":
        """vLLM's constructor: zeroed counters for drafts of at most num_spec_tokens."""
        return cls(num_spec_tokens, num_accepted_tokens_per_pos=[0] * num_spec_tokens,
                   num_draft_tokens_per_pos=[0] * num_spec_tokens)

    def observe_draft(self, num_draft_tokens: int, num_accepted_tokens: int) -> None:
        """One request-step that verified num_draft_tokens drafts and kept num_accepted_tokens of them.

        As vLLM: the totals count first, then an AssertionError where more tokens were accepted than a draft may
        hold (num_spec_tokens): that is the engine's own bug (unverified tokens counted as accepted), not input."""
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted_tokens
        assert num_accepted_tokens <= self.num_spec_tokens, \
            f"{num_accepted_tokens} tokens accepted from a draft of at most {self.num_spec_tokens}"
        for pos in range(num_accepted_tokens):
            self.num_accepted_tokens_per_pos[pos] += 1
        for pos in range(num_draft_tokens):
            self.num_draft_tokens_per_pos[pos] += 1

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
