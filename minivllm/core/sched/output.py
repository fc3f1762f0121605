"""Mirror of vllm/v1/core/sched/output.py: the plan one schedule() hands to the model runner.

New requests travel whole (NewRequestData); requests the runner already knows
travel as a delta (CachedRequestData): their new blocks and progress. Left out:
spec-decode tokens, encoder inputs, grammar bitmasks, KV-connector metadata, new_block_ids_to_zero
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


@dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: dict[str, int]  # req_id -> tokens this step
    total_num_scheduled_tokens: int
    finished_req_ids: set[str]  # finished since the last step: the runner drops their state
    preempted_req_ids: set[str] = field(default_factory=set)
