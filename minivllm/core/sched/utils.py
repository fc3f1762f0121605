"""Mirror of vllm/v1/core/sched/utils.py: the stop check and the list helper update_from_output uses.

Also `check_request_fits`, the admission check that refuses up front a request the pool could never hold
(vLLM checks the length in its input processor and lets a too-large request wait). Left out: the
speculative-decoding and pooling variants of the stop check, and stop strings (the caller's side here).
"""
from __future__ import annotations

from minivllm.request import Request, RequestStatus
from minivllm.utils.math_utils import cdiv


def remove_all(lst: list, items_to_remove: set) -> list:
    """`lst` without the given items, order kept: one pass instead of one list.remove() per item."""
    return [item for item in lst if item not in items_to_remove]


def check_stop(request: Request, max_model_len: int) -> bool:
    """Set a finished status on `request` if its last token ends it; stop strings are the caller's side."""
    params = request.sampling_params
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len
    if request.num_tokens >= max_model_len or request.num_output_tokens >= max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    if request.num_output_tokens < params.min_tokens:
        return False
    last = request.output_token_ids[-1]
    if not params.ignore_eos and last == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    if last in params.stop_token_ids:
        request.status = RequestStatus.FINISHED_STOPPED
        request.stop_reason = last
        return True
    return False


def check_request_fits(num_prompt_tokens: int, max_tokens: int | None, max_model_len: int,
                       block_size: int, num_gpu_blocks: int) -> None:
    """Raise ValueError for a request that could never be served, instead of letting it wait forever."""
    if num_prompt_tokens == 0:
        raise ValueError("The prompt is empty: pass at least one token.")
    if num_prompt_tokens >= max_model_len:  # as vLLM: the prompt must leave room for one output token
        raise ValueError(f"The prompt has {num_prompt_tokens} tokens but max_model_len={max_model_len} must hold it "
                         f"and at least one output token: shorten the prompt below {max_model_len} tokens or raise "
                         f"max_model_len.")
    max_len = min(num_prompt_tokens + (max_tokens or max_model_len), max_model_len)
    # The last sampled token never enters the KV cache, hence max_len - 1 slots.
    needed, available = cdiv(max(max_len - 1, num_prompt_tokens), block_size), num_gpu_blocks - 1
    if needed > available:
        raise ValueError(f"The request needs up to {needed} KV blocks ({max_len} tokens at block_size={block_size}) "
                         f"but the pool has only {available}: lower max_tokens, shorten the prompt or raise "
                         f"num_gpu_blocks_override.")
