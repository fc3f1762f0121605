"""Mirror of vllm/v1/core/sched/output.py: the plan one schedule() hands to the model runner.

New requests travel whole (NewRequestData); requests the runner already knows
travel as a delta (CachedRequestData): their new blocks and progress. With speculative decoding
`scheduled_spec_decode_tokens` carries each request's drafts scheduled this step. Left out: encoder inputs, grammar bitmasks, KV-connector metadata, new_block_ids_to_zero
(the null block and masking keep stale KV harmless).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.sampling_params import SamplingParams


@dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    block_ids: list[int]  # every block, prefix-cache hits first
    num_computed_tokens: int  # > 0 when the head of the prompt was found in the prefix cache


@dataclass
class CachedRequestData:
    req_ids: list[str] = field(default_factory=list)
    resumed_from_preemption: list[bool] = field(default_factory=list)
    # a resumed request's row is rebuilt: the runner needs every token again (and, in new_block_ids, every
    # block: its computation restarts at num_computed_tokens, 0 or its own blocks found in the prefix cache)
    resumed_req_token_ids: list[list[int] | None] = field(default_factory=list)
    new_block_ids: list[list[int]] = field(default_factory=list)
    num_computed_tokens: list[int] = field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    @classmethod
    def make(cls, running: list, resumed: list, new_block_ids: dict[str, list[int]]) -> "CachedRequestData":
        """The delta of the running requests scheduled this step, then of the preempted ones resumed."""
        cached = cls()
        for request in running + resumed:
            is_resumed = request in resumed
            cached.req_ids.append(request.request_id)
            cached.resumed_from_preemption.append(is_resumed)
            cached.resumed_req_token_ids.append(request.all_token_ids if is_resumed else None)
            cached.new_block_ids.append(new_block_ids[request.request_id])
            cached.num_computed_tokens.append(request.num_computed_tokens)
        return cached


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens this step
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # finished since the last step: the runner drops their state
    preempted_req_ids: set[str] = field(default_factory=set)
    # req_id -> the draft tokens it verifies this step (only requests that carry drafts)
    scheduled_spec_decode_tokens: dict[str, list[int]] = field(default_factory=dict)
    # the most drafts a request carries into the next step (speculative decoding; spec_decode/config.py)
    num_spec_tokens_to_schedule: int = 0
