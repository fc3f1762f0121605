"""Lab 6 (article part 6): the stop check and reclamation. Write check_stop and Scheduler._free_request.

After each sampled token, update_from_output calls check_stop; a stopped request is freed at once so the next
schedule() can hand its blocks to WAITING requests. Time: about 30 minutes.
"""
from minivllm.request import RequestStatus


def check_stop(request, max_model_len: int) -> bool:
    """Whether the token just appended ends `request`; if it does, set its finished status (and stop_reason).

    Inputs: request (its sampling_params, num_tokens = prompt + outputs, num_output_tokens, output_token_ids,
    eos_token_id) and the model's max_model_len. Output: True if it stopped, else False (status unchanged).
    The rules, in priority order:
      - length: num_tokens >= max_model_len, or num_output_tokens >= max_tokens (None means max_model_len):
        FINISHED_LENGTH_CAPPED, whatever the last token is;
      - before min_tokens outputs nothing else stops it;
      - the last token is EOS (unless ignore_eos): FINISHED_STOPPED;
      - the last token is in stop_token_ids: FINISHED_STOPPED, and stop_reason is that token.
    Example: max_tokens=3, outputs [5, 6, 2] with EOS = 2 -> True, FINISHED_LENGTH_CAPPED (the length wins);
    max_tokens=10 and the same outputs -> True, FINISHED_STOPPED, stop_reason None.
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
    """Reclaim a request that just finished (its status is already a FINISHED_* one, it is out of RUNNING).

    After the call (what the grader checks):
      - the request holds no block: each of its blocks lost the one reference it held (a block shared with a
        running request stays held), its own blocks are in the free queue end-of-sequence first, full blocks
        still cached, so a later request with the same prompt hits what the pool has not yet reused;
      - its id is in self.finished_req_ids (the next step tells the model runner to release its row);
      - it is no longer in self.requests.
    Example (block_size 4): A holds [1, 2, 3, 4], B holds [1, 2, 8, 9], the free queue is [10, 11]. After
    freeing A: blocks 1 and 2 have ref_cnt 1, the free queue is [10, 11, 4, 3], "A" in self.finished_req_ids.
    """
    ### BEGIN SOLUTION
    self.kv_cache_manager.free(request)
    self.finished_req_ids.add(request.request_id)
    del self.requests[request.request_id]
    ### END SOLUTION
