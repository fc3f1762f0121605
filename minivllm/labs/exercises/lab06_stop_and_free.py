"""Lab 6 (article part 6): the stop check and reclamation. Write check_stop and Scheduler._free_request.

After each sampled token, update_from_output calls check_stop; a stopped request is freed at once so the next
schedule() can hand its blocks to WAITING requests. Time: about 30 minutes.
"""
from minivllm.request import RequestStatus


def check_stop(request, max_model_len: int) -> bool:
    """True (and a finished status on `request`) if its last token ends it.

    Length first: num_tokens >= max_model_len or num_output_tokens >= max_tokens (None: max_model_len)
    -> FINISHED_LENGTH_CAPPED. Then, once num_output_tokens >= min_tokens: the last token equal to
    request.eos_token_id (unless ignore_eos) -> FINISHED_STOPPED; in params.stop_token_ids -> FINISHED_STOPPED
    with request.stop_reason = that token.
    """
    ### BEGIN SOLUTION
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
    ### END SOLUTION


def _free_request(self, request) -> None:
    """Give a finished request's blocks back (self.kv_cache_manager.free), tell the runner
    (self.finished_req_ids), and forget it (self.requests).
    """
    ### BEGIN SOLUTION
    self.kv_cache_manager.free(request)
    self.finished_req_ids.add(request.request_id)
    del self.requests[request.request_id]
    ### END SOLUTION
