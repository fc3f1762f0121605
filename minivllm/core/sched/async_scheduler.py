"""Mirror of vllm/v1/core/sched/async_scheduler.py: the scheduler of an engine that schedules step N+1 while step
N runs.

With async scheduling EngineCore does not wait for a step's sampled tokens before it plans the next step (its
batch queue, engine/core.py). A running request is then scheduled for a token whose value is not known yet: each
step that will sample for it adds one *output placeholder* (`num_output_placeholders`), `_num_new_tokens` counts
placeholders like known tokens, and the runner, which appended the sampled token to its own copy of the request
before it runs the next step, fills the value in. When the step's output arrives, update_from_output turns one
placeholder into a real token. A request that finished in step N (EOS, a stop token, its length) was already
scheduled in step N+1: that step's token for it is dropped (update_from_output skips finished requests), so the
caller never sees it, and its blocks are freed at once (the worker runs steps in order, so nothing reads them
after step N+1 wrote them). A request sure to reach max_tokens or max_model_len with the tokens in flight is not
scheduled again. Left out: speculative decoding (refused, as vLLM refuses its CPU n-gram proposer with async
scheduling), structured output, pipeline-parallel microbatches.
"""
from __future__ import annotations

from minivllm.core.sched.output import SchedulerOutput
from minivllm.core.sched.scheduler import Scheduler
from minivllm.request import Request, RequestStatus


class AsyncScheduler(Scheduler):
    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        super()._update_after_schedule(scheduler_output)
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests[req_id]
            if request.num_computed_tokens >= request.num_tokens:  # not a prefill chunk: this step samples
                request.num_output_placeholders += 1

    def _num_new_tokens(self, request: Request, token_budget: int, num_computed_tokens: int | None = None) -> int:
        if num_computed_tokens is None and self._finishes_in_flight(request):
            return 0  # the steps in flight already bring it to max_tokens or max_model_len
        return super()._num_new_tokens(request, token_budget, num_computed_tokens)

    def _finishes_in_flight(self, request: Request) -> bool:
        """True if the tokens still in flight take the request to its length limit, whatever their values."""
        in_flight = request.num_output_placeholders
        if in_flight == 0:
            return False
        max_tokens = request.sampling_params.max_tokens
        return (request.num_tokens + in_flight >= self.max_model_len or
                (max_tokens is not None and request.num_output_tokens + in_flight >= max_tokens))

    def _update_request_with_output(self, request: Request, new_token_ids: list[int]) -> tuple[list[int], bool]:
        was_running = request.status == RequestStatus.RUNNING
        new_token_ids, stopped = super()._update_request_with_output(request, new_token_ids)
        request.num_output_placeholders -= 1  # this step's placeholder is a real token now (or the request ended)
        assert request.num_output_placeholders >= 0, request
        if was_running:  # the blocks the known tokens fill can be found by prefix now (a preempted one has none)
            self.kv_cache_manager.cache_blocks(request, request.num_computed_tokens - request.num_output_placeholders)
        return new_token_ids, stopped
