"""Mirror of vllm/v1/request.py: one request's state as the scheduler sees it.

The single progress model of the V1 scheduler lives here: `num_computed_tokens`
(tokens whose KV is in the cache) catches up with `num_tokens` (prompt plus the
outputs sampled so far). A prefill and a decode differ only in the gap.
With prefix caching a request also carries `block_hashes`, one per full block of its tokens,
extended by `append_output_token_ids` as outputs fill more blocks.
With speculative decoding `spec_token_ids` holds the drafts proposed for the next step; they count toward
`num_tokens_with_spec` (what the scheduler budgets) but never toward num_tokens until verified.
Left out: async-scheduling placeholders, multimodal inputs, structured output, LoRA.
"""
from __future__ import annotations

import enum
import time
from typing import Callable

from minivllm.sampling_params import SamplingParams


class RequestStatus(enum.IntEnum):
    WAITING = enum.auto()
    RUNNING = enum.auto()
    PREEMPTED = enum.auto()
    # everything after PREEMPTED is finished
    FINISHED_STOPPED = enum.auto()
    FINISHED_LENGTH_CAPPED = enum.auto()
    FINISHED_ABORTED = enum.auto()

    @staticmethod
    def is_finished(status: "RequestStatus") -> bool:
        return status > RequestStatus.PREEMPTED

    @staticmethod
    def get_finished_reason(status: "RequestStatus") -> str | None:
        return {
            RequestStatus.FINISHED_STOPPED: "stop",
            RequestStatus.FINISHED_LENGTH_CAPPED: "length",
            RequestStatus.FINISHED_ABORTED: "abort",
        }.get(status)


class Request:
    def __init__(
        self,
        request_id: str,
        prompt_token_ids: list[int],
        sampling_params: SamplingParams,
        eos_token_id: int | None,
        priority: int = 0,
        arrival_time: float | None = None,
        block_hasher: Callable[["Request"], list[bytes]] | None = None,
    ) -> None:
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.sampling_params = sampling_params
        self.eos_token_id = eos_token_id
        self.priority = priority
        self.arrival_time = time.time() if arrival_time is None else arrival_time
        self.status = RequestStatus.WAITING
        self.stop_reason: int | str | None = None
        self.output_token_ids: list[int] = []
        self.num_computed_tokens = 0
        # Async scheduling: tokens of steps still in flight, scheduled before their value is known (vLLM's name)
        self.num_output_placeholders = 0
        self.spec_token_ids: list[int] = []  # drafts for the next step (speculative decoding)
        self.num_preemptions = 0
        # Prefix caching. num_cached_tokens: the prefix-cache hit of the first admission (-1: not yet admitted).
        self.num_cached_tokens = -1
        # prompt_logprobs need every prompt position computed, so such a request never reads the cache
        # (vLLM's SamplingParams.skip_reading_prefix_cache default); it still writes its blocks to it.
        self.skip_reading_prefix_cache = sampling_params.prompt_logprobs is not None
        self.block_hasher = block_hasher  # None: no hashes, nothing to look up (prefix caching off)
        self.block_hashes: list[bytes] = []
        if block_hasher is not None:
            self.block_hashes = block_hasher(self)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_tokens_with_spec(self) -> int:
        return self.num_tokens + len(self.spec_token_ids)

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    def append_output_token_ids(self, token_ids: int | list[int]) -> None:
        """Append sampled tokens; the blocks they fill get their hashes now."""
        self.output_token_ids.extend([token_ids] if isinstance(token_ids, int) else token_ids)
        if self.block_hasher is not None:
            self.block_hashes.extend(self.block_hasher(self))

    def is_finished(self) -> bool:
        return RequestStatus.is_finished(self.status)

    def get_finished_reason(self) -> str | None:
        return RequestStatus.get_finished_reason(self.status)

    def __repr__(self) -> str:
        return (f"Request({self.request_id!r}, {self.status.name}, "
                f"computed={self.num_computed_tokens}/{self.num_tokens})")
