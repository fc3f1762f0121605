"""Mirror of vllm/v1/core/sched/utils.py: the stop check and the list helper update_from_output uses."""
from __future__ import annotations

from minivllm.request import Request, RequestStatus


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
