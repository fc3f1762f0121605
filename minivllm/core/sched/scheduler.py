"""Mirror of vllm/v1/core/sched/scheduler.py: decide, each step, who advances by how many tokens.

The scheduler knows nothing of tensors: it reads requests and the block pool and writes a SchedulerOutput.
With prefix caching a waiting request is admitted at the end of its longest cached prefix and charged budget
only for the rest. With speculative decoding a running request's drafts are budgeted like any uncomputed
token; update_from_output rolls num_computed_tokens back by the rejected ones. `observers` (tracing) are told
after add_request, schedule, update_from_output and finish_requests, to read the state; they change nothing.
Async scheduling is AsyncScheduler (async_scheduler.py), built on the hooks here: `_update_after_schedule`,
`_update_request_with_output` and each request's num_output_placeholders. Left out: encoder inputs, structured
output, KV connectors.
"""
from __future__ import annotations

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager
from minivllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.core.sched.request_queue import create_request_queue
from minivllm.core.sched.utils import check_request_fits, check_stop, remove_all
from minivllm.engine import EngineCoreOutput, EngineCoreOutputs
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestStatus
from minivllm.spec_decode.config import num_spec_tokens_to_schedule
from minivllm.spec_decode.metrics import SpecDecodingStats


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig, num_spec_tokens: int = 0,
                 max_verify_tokens: int | None = None) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_model_len = scheduler_config.max_model_len
        self.kv_cache_manager = KVCacheManager(cache_config.block_size, cache_config.num_gpu_blocks,
                                               cache_config.enable_prefix_caching)
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # since the last schedule(): the runner drops them
        self.num_preemptions = 0
        self.spec_decoding_stats = SpecDecodingStats(num_spec_tokens) if num_spec_tokens else None
        self.num_spec_tokens, self.max_verify_tokens = num_spec_tokens, max_verify_tokens  # drafts: k, and its bound
        self.observers: list = []  # tracing: reads the state right after each call below; changes nothing

    def _notify(self, hook: str, *args) -> None:
        for observer in self.observers:
            getattr(observer, hook)(self, *args)

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        check_request_fits(request.num_prompt_tokens, request.sampling_params.max_tokens, self.max_model_len,
                           self.cache_config.block_size, self.cache_config.num_gpu_blocks)
        self.requests[request.request_id] = request
        self.waiting.add_request(request)
        self._notify("on_add_request", request)

    # There is no prefill phase and no decode phase. Each request has num_computed_tokens
    # (KV already in the cache) and num_tokens (prompt + sampled outputs); every step hands out
    # tokens so the first catches up with the second: a whole or partial prompt, one decode token,
    # or a recompute after preemption. RUNNING requests are served first, WAITING ones get what is left.
    # A prefix-cache hit is one more way to catch up: a waiting request starts at num_computed_tokens = hit.
    def schedule(self) -> SchedulerOutput:
        cfg = self.scheduler_config
        token_budget = cfg.max_num_batched_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        scheduled_resumed: list[Request] = []
        preempted: list[Request] = []
        spec_tokens: dict[str, list[int]] = {}  # scheduled_spec_decode_tokens

        # Phase 1: RUNNING first. A failed allocation preempts a victim and retries.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = self._num_new_tokens(request, token_budget)  # clamped to the budget
            if num_new_tokens == 0:
                req_index += 1
                continue
            while True:
                new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
                if new_blocks is not None:
                    break
                victim = self._select_victim()
                self.running.remove(victim)
                if victim in scheduled_running:  # already planned this step (priority): give back its tokens,
                    scheduled_running.remove(victim)  # and uncache the blocks allocated for them (no KV in them)
                    token_budget += num_scheduled_tokens.pop(victim.request_id)
                    new_block_ids.pop(victim.request_id)
                    spec_tokens.pop(victim.request_id, None)
                    self.kv_cache_manager.uncache_unwritten_blocks(victim)
                    req_index -= 1
                self._preempt_request(victim)
                preempted.append(victim)
                if victim is request:
                    break
            if new_blocks is None:  # the request preempted itself: nothing else to take from
                break
            scheduled_running.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = [b.block_id for b in new_blocks]
            token_budget -= num_new_tokens
            req_index += 1
            if request.spec_token_ids:  # drafts past the budget are dropped; new ones come with the step's output
                num_drafts = request.num_computed_tokens + num_new_tokens - request.num_tokens
                if num_drafts > 0:
                    spec_tokens[request.request_id] = request.spec_token_ids[:num_drafts]
                request.spec_token_ids = []

        # Phase 2: admit WAITING with the budget left, unless this step already had to preempt.
        while not preempted and len(self.waiting) and token_budget > 0:
            if len(self.running) >= cfg.max_num_seqs:
                break
            request = self.waiting.peek_request()
            computed_blocks, num_computed_tokens = self.kv_cache_manager.get_computed_blocks(request)
            num_new_tokens = self._num_new_tokens(request, token_budget, num_computed_tokens)
            if num_new_tokens == 0:
                break  # too long to fit whole without chunked prefill: stays at the head of WAITING, retried whole
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens, num_computed_tokens,
                                                              computed_blocks)
            if new_blocks is None:
                break  # no blocks: waiting requests never preempt running ones
            self.waiting.pop_request()
            self.kv_cache_manager.record_prefix_cache_stats(request, num_computed_tokens)
            (scheduled_resumed if request.status == RequestStatus.PREEMPTED else scheduled_new).append(request)
            request.status = RequestStatus.RUNNING
            request.num_computed_tokens = num_computed_tokens
            if request.num_cached_tokens < 0:  # the first admission's hit is what the caller sees
                request.num_cached_tokens = num_computed_tokens
            self.running.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            # every block, hits included: the runner builds an admitted request's row from scratch
            new_block_ids[request.request_id] = self.kv_cache_manager.get_block_ids(request.request_id)
            token_budget -= num_new_tokens

        # Pack the plan, then advance the progress model (vLLM's _update_after_schedule).
        output = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData(r.request_id, list(r.prompt_token_ids), r.sampling_params,
                                               self.kv_cache_manager.get_block_ids(r.request_id),
                                               r.num_computed_tokens) for r in scheduled_new],
            scheduled_cached_reqs=CachedRequestData.make(scheduled_running, scheduled_resumed, new_block_ids),
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted},
            scheduled_spec_decode_tokens=spec_tokens,
            num_spec_tokens_to_schedule=self._num_spec_tokens_to_schedule(),
        )
        self._update_after_schedule(output)
        self._notify("on_schedule", output)
        return output

    def _update_after_schedule(self, scheduler_output: SchedulerOutput) -> None:
        """Advance each scheduled request's progress as if its step had run; the runner drops the finished."""
        for req_id, n in scheduler_output.num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
        self.finished_req_ids = set()

    def _num_new_tokens(self, request: Request, token_budget: int, num_computed_tokens: int | None = None) -> int:
        """How far num_computed_tokens (at admission the cache hit: whole blocks, never the last token, so 48 cached
        of a 55-token prompt cost 7) trails num_tokens, capped by long_prefill_token_threshold (only with chunked
        prefill on), clamped to token_budget; at admission without chunked prefill 0 if the rest does not fit."""
        admitting = num_computed_tokens is not None
        if not admitting:  # a running request's drafts count like any uncomputed token (a waiting one has none)
            num_computed_tokens = request.num_computed_tokens
        # A running request's placeholders (async scheduling) are tokens of steps still in flight: each is
        # scheduled like a known one, its value filled in by the runner.
        num_new_tokens = (request.num_tokens if admitting else
                          request.num_tokens_with_spec + request.num_output_placeholders) - num_computed_tokens
        cfg = self.scheduler_config
        if cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold:
            num_new_tokens = min(num_new_tokens, cfg.long_prefill_token_threshold)
        if admitting and not cfg.enable_chunked_prefill and num_new_tokens > token_budget:
            return 0
        # the budget clamp (at admission: the chunked-prefill clamp); no draft's position may reach max_model_len
        return min(num_new_tokens, token_budget, self.max_model_len - 1 - num_computed_tokens)

    def _select_victim(self) -> Request:
        """The RUNNING request to preempt: the lowest priority, or with FCFS the tail (LIFO: the latest admitted)."""
        by_priority = self.scheduler_config.policy == "priority"
        return max(self.running, key=lambda r: (r.priority, r.arrival_time)) if by_priority else self.running[-1]

    def _preempt_request(self, request: Request) -> None:
        """Preemption by recompute: drop the KV, forget the progress, go first in line.

        With prefix caching the freed blocks stay cached, so unless they are evicted meanwhile the
        request's readmission hits its own old blocks and recomputes only what was lost.
        """
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        request.spec_token_ids = []  # drafts are dropped with the KV
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, check stops, free what finished, report the deltas."""
        outputs: list[EngineCoreOutput] = []
        stopped_running_reqs: set[Request] = set()
        stopped_preempted_reqs: set[Request] = set()
        logprobs = model_runner_output.logprobs
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue  # aborted while the step ran
            req_index = model_runner_output.req_id_to_index[req_id]
            generated = model_runner_output.sampled_token_ids[req_index]
            if not generated:
                continue  # a partial prefill chunk samples nothing
            drafts = scheduler_output.scheduled_spec_decode_tokens.get(req_id)
            if drafts:  # kept len(generated) - 1
                request.num_computed_tokens -= len(drafts) + 1 - len(generated)  # roll back the rejected drafts
                self.spec_decoding_stats.observe_draft(len(drafts), len(generated) - 1)
            was_preempted = request.status == RequestStatus.PREEMPTED  # async: preempted while its step ran
            new_token_ids, stopped = self._update_request_with_output(request, generated)
            new_logprobs = logprobs[req_index][:len(new_token_ids)] if logprobs and logprobs[req_index] else None
            if stopped:
                finished = self._handle_stopped_request(request)
                if finished:  # its blocks go back to the pool now
                    self._free_request(request)
                (stopped_preempted_reqs if was_preempted else stopped_running_reqs).add(request)
            outputs.append(EngineCoreOutput(req_id, new_token_ids, new_logprobs,
                                            request.get_finished_reason(), request.stop_reason,
                                            model_runner_output.prompt_logprobs_dict.get(req_id),
                                            num_cached_tokens=request.num_cached_tokens))
        if stopped_running_reqs:
            self.running = remove_all(self.running, stopped_running_reqs)
        if stopped_preempted_reqs:
            self.waiting.remove_requests(stopped_preempted_reqs)
        engine_core_outputs = EngineCoreOutputs(outputs=outputs)
        self._notify("on_update", scheduler_output, model_runner_output, engine_core_outputs)
        return engine_core_outputs

    def update_draft_token_ids(self, draft_token_ids) -> None:
        """Speculative decoding: each still-running request's drafts for its next step (a DraftTokenIds), as many
        as the batch in flight allows (_num_spec_tokens_to_schedule)."""
        k = self._num_spec_tokens_to_schedule()
        for req_id, drafts in zip(draft_token_ids.req_ids, draft_token_ids.draft_token_ids):
            request = self.requests.get(req_id)
            if request is not None and request.status == RequestStatus.RUNNING:
                request.spec_token_ids = drafts[:k]

    def _num_spec_tokens_to_schedule(self) -> int:
        """Drafts per request for the next step, from the requests in flight (running, and waiting up to
        max_num_seqs): k, fewer as the batch grows past max_verify_tokens (spec_decode/config.py)."""
        in_flight = min(len(self.running) + len(self.waiting), self.scheduler_config.max_num_seqs)
        return num_spec_tokens_to_schedule(self.num_spec_tokens, in_flight, self.max_verify_tokens)

    def _update_request_with_output(self, request: Request, new_token_ids: list[int]) -> tuple[list[int], bool]:
        """Append the sampled tokens one by one up to the first that ends the request: (tokens kept, stopped)."""
        for i, token_id in enumerate(new_token_ids):
            request.append_output_token_ids(token_id)  # also hashes a block the token fills
            if check_stop(request, self.max_model_len):
                return new_token_ids[:i + 1], True
        return new_token_ids, False

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> None:
        """Finish requests from outside the step (abort, stop string): out of the queues, blocks freed."""
        assert RequestStatus.is_finished(finished_status)
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        requests = [self.requests[i] for i in ids if i in self.requests]
        running = {r for r in requests if r.status == RequestStatus.RUNNING}
        self.running = remove_all(self.running, running)
        self.waiting.remove_requests({r for r in requests if r not in running})
        for request in requests:
            request.status = finished_status
            self._free_request(request)
        self._notify("on_finish_requests", ids, finished_status)

    def _handle_stopped_request(self, request: Request) -> bool:
        """True: the stopped request is finished. (vLLM returns False for a resumable streaming-input session,
        which it re-queues for its next input; minivllm has no such sessions, so every stop finishes.)"""
        return True

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def reset_prefix_cache(self) -> bool:  # False while requests hold blocks (vLLM's default: no forced preemption)
        return self.kv_cache_manager.reset_prefix_cache()

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0
