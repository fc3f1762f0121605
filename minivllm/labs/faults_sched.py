"""The broken functions of labs 1, 2 and 6 (the engine loop and the scheduler): each a mistake students make.

faults.py names them and says which lab catches each. Each is written against the lab's own reference exercise,
changed in the one place the mistake is.
"""
from __future__ import annotations

from minivllm.core.sched.scheduler import Scheduler
from minivllm.labs.exercises import lab06_stop_and_free
from minivllm.request import RequestStatus


# -- lab 1 ------------------------------------------------------------------------------------------------
def _submit(engine, prompts, params) -> list[str]:
    ids = [engine.next_request_id() for _ in prompts]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    return ids


def generate_one_step(engine, prompts, params):
    """Steps once per request instead of until has_unfinished_requests() is False."""
    ids, finished = _submit(engine, prompts, params), {}
    for _ in prompts:
        for output in engine.step():
            finished[output.request_id] = output
    return [finished[r] for r in ids if r in finished]


def generate_finish_order(engine, prompts, params):
    """Returns the outputs in the order the requests finished, not the order of the prompts."""
    _submit(engine, prompts, params)
    done = []
    while engine.has_unfinished_requests():
        done.extend(o for o in engine.step() if o.finished)
    return done


def generate_max_tokens_steps(engine, prompts, params):
    """Steps max_tokens times: enough when each prompt is prefilled in one step, not when prefill is chunked."""
    ids, finished = _submit(engine, prompts, params), {}
    for _ in range(params.max_tokens):
        for output in engine.step():
            finished[output.request_id] = output
    return [finished[r] for r in ids if r in finished]


def generate_first_output(engine, prompts, params):
    """Keeps each request's first output (one token) instead of its finished one."""
    ids, first = _submit(engine, prompts, params), {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            first.setdefault(output.request_id, output)
    return [first[r] for r in ids]


# -- lab 2 ------------------------------------------------------------------------------------------------
def _preempted(self, request, count_request: bool = True) -> None:
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += int(count_request)
    self.num_preemptions += 1


def preempt_append(self, request) -> None:
    """Puts the victim at the tail of WAITING: newer requests overtake it (starvation)."""
    self.kv_cache_manager.free(request)
    _preempted(self, request)
    self.waiting.add_request(request)


def preempt_keep_progress(self, request) -> None:
    """Frees the KV but keeps num_computed_tokens: the resumed request reads KV that is gone."""
    self.kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_preemptions += 1
    self.num_preemptions += 1
    self.waiting.prepend_request(request)


def preempt_no_free(self, request) -> None:
    """Forgets the progress but not the blocks: the victim's blocks leak."""
    self.kv_cache_manager.req_to_blocks.pop(request.request_id, None)
    self.kv_cache_manager.num_cached_block.pop(request.request_id, None)
    _preempted(self, request)
    self.waiting.prepend_request(request)


def preempt_free_forward(self, request) -> None:
    """Gives the blocks back straight to the pool, head first: the shared prefix is evicted before the tail."""
    blocks = self.kv_cache_manager.req_to_blocks.pop(request.request_id, [])
    self.kv_cache_manager.num_cached_block.pop(request.request_id, None)
    self.kv_cache_manager.block_pool.free_blocks(blocks)
    _preempted(self, request)
    self.waiting.prepend_request(request)


def preempt_no_request_count(self, request) -> None:
    """Counts the preemption on the scheduler only: request.num_preemptions stays 0."""
    self.kv_cache_manager.free(request)
    _preempted(self, request, count_request=False)
    self.waiting.prepend_request(request)


def preempt_evicts_cache(self, request) -> None:
    """Also drops the victim's blocks from the prefix cache ("its KV is gone"): no hit on readmission, and a
    prefix it shares with a running request stops being found by anyone."""
    blocks = list(self.kv_cache_manager.req_to_blocks.get(request.request_id, []))
    self.kv_cache_manager.free(request)
    self.kv_cache_manager.block_pool.evict_blocks(blocks)
    _preempted(self, request)
    self.waiting.prepend_request(request)


_num_new_tokens = Scheduler._num_new_tokens  # ours, taken before anything is patched


def budget_clamp_removed(self, request, token_budget, num_computed_tokens=None):
    """Admits a waiting request with its whole prompt, whatever is left of the token budget."""
    if num_computed_tokens is None:
        return _num_new_tokens(self, request, token_budget)
    return _num_new_tokens(self, request, self.scheduler_config.max_model_len, num_computed_tokens)


def victim_fifo(self):
    """Preempts the head of RUNNING (the earliest admitted) instead of the tail (LIFO)."""
    return self.running[0]


# -- lab 6 ------------------------------------------------------------------------------------------------
def stop_off_by_one(request, max_model_len: int) -> bool:
    """`>` where `>=` belongs: every request runs one token past max_tokens."""
    params = request.sampling_params
    if params.max_tokens is not None and request.num_output_tokens == params.max_tokens:
        return False
    return lab06_stop_and_free.check_stop(request, max_model_len)


def stop_ignores_eos(request, max_model_len: int) -> bool:
    """Never stops at EOS: requests run on to max_tokens."""
    params = request.sampling_params
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len
    if request.num_tokens >= max_model_len or request.num_output_tokens >= max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def stop_eos_before_length(request, max_model_len: int) -> bool:
    """Checks EOS before the length: EOS as the last allowed token finishes as "stop", not "length"."""
    params = request.sampling_params
    if request.num_output_tokens >= params.min_tokens and not params.ignore_eos and \
            request.output_token_ids[-1] == request.eos_token_id:
        request.status = RequestStatus.FINISHED_STOPPED
        return True
    return lab06_stop_and_free.check_stop(request, max_model_len)


def stop_model_len_off_by_one(request, max_model_len: int) -> bool:
    """`num_tokens > max_model_len`: a request may grow one token past the model's length."""
    return lab06_stop_and_free.check_stop(request, max_model_len + 1)


def free_not_freed(self, request) -> None:
    """A finished request leaves the queues but its blocks never go back to the pool."""
    self.kv_cache_manager.req_to_blocks.pop(request.request_id, None)
    self.kv_cache_manager.num_cached_block.pop(request.request_id, None)
    self.finished_req_ids.add(request.request_id)
    del self.requests[request.request_id]


def free_keeps_registered(self, request) -> None:
    """Frees the blocks and tells the runner but never forgets the request: scheduler.requests grows forever."""
    self.kv_cache_manager.free(request)
    self.finished_req_ids.add(request.request_id)


def free_no_finished_ids(self, request) -> None:
    """Never tells the runner: the request's row in the input batch is never released."""
    self.kv_cache_manager.free(request)
    del self.requests[request.request_id]


def free_forward_order(self, request) -> None:
    """Frees the blocks head first: the next allocations evict the prefix other requests would hit."""
    blocks = self.kv_cache_manager.req_to_blocks.pop(request.request_id, [])
    self.kv_cache_manager.num_cached_block.pop(request.request_id, None)
    self.kv_cache_manager.block_pool.free_blocks(blocks)
    self.finished_req_ids.add(request.request_id)
    del self.requests[request.request_id]
