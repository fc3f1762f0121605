"""Mirror of vllm/v1/core/sched/scheduler.py: decide, each step, who advances by how many tokens.

The scheduler knows nothing of tensors: it reads requests and the block pool and
writes a SchedulerOutput. Left out: prefix caching, speculative decoding,
encoder inputs, structured output, KV connectors, async scheduling.
"""
from __future__ import annotations

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.kv_cache_manager import KVCacheManager, cdiv
from minivllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.core.sched.request_queue import create_request_queue
from minivllm.engine import EngineCoreOutput, EngineCoreOutputs
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestStatus


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


class Scheduler:
    def __init__(self, scheduler_config: SchedulerConfig, cache_config: CacheConfig) -> None:
        self.scheduler_config = scheduler_config
        self.cache_config = cache_config
        self.max_model_len = scheduler_config.max_model_len
        self.kv_cache_manager = KVCacheManager(cache_config.block_size, cache_config.num_gpu_blocks)
        self.requests: dict[str, Request] = {}
        self.waiting = create_request_queue(scheduler_config.policy)
        self.running: list[Request] = []
        self.finished_req_ids: set[str] = set()  # since the last schedule(): the runner drops them
        self.num_preemptions = 0

    def add_request(self, request: Request) -> None:
        if request.request_id in self.requests:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        check_request_fits(request.num_prompt_tokens, request.sampling_params.max_tokens, self.max_model_len,
                           self.cache_config.block_size, self.cache_config.num_gpu_blocks)
        self.requests[request.request_id] = request
        self.waiting.add_request(request)

    # There is no prefill phase and no decode phase. Each request has num_computed_tokens
    # (KV already in the cache) and num_tokens (prompt + sampled outputs); every step hands out
    # tokens so the first catches up with the second: a whole or partial prompt, one decode token,
    # or a recompute after preemption. RUNNING requests are served first, WAITING ones get what is left.
    def schedule(self) -> SchedulerOutput:
        cfg = self.scheduler_config
        token_budget = cfg.max_num_batched_tokens
        num_scheduled_tokens: dict[str, int] = {}
        new_block_ids: dict[str, list[int]] = {}
        scheduled_running: list[Request] = []
        scheduled_new: list[Request] = []
        scheduled_resumed: list[Request] = []
        preempted: list[Request] = []

        # Phase 1: RUNNING first. A failed allocation preempts a victim and retries.
        req_index = 0
        while req_index < len(self.running) and token_budget > 0:
            request = self.running[req_index]
            num_new_tokens = min(self._num_new_tokens(request), token_budget)  # the budget clamp
            if num_new_tokens == 0:
                req_index += 1
                continue
            while (new_blocks := self.kv_cache_manager.allocate_slots(request, num_new_tokens)) is None:
                if cfg.policy == "priority":
                    victim = max(self.running, key=lambda r: (r.priority, r.arrival_time))
                    self.running.remove(victim)
                    if victim in scheduled_running:  # already planned this step: give back its tokens
                        scheduled_running.remove(victim)
                        token_budget += num_scheduled_tokens.pop(victim.request_id)
                        new_block_ids.pop(victim.request_id)
                        req_index -= 1
                else:
                    victim = self.running.pop()  # FCFS: the tail, the most recently admitted
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

        # Phase 2: admit WAITING with the budget left, unless this step already had to preempt.
        while not preempted and len(self.waiting) and token_budget > 0:
            if len(self.running) >= cfg.max_num_seqs:
                break
            request = self.waiting.peek_request()
            num_new_tokens = self._num_new_tokens(request)
            if not cfg.enable_chunked_prefill and num_new_tokens > token_budget:
                break  # stays at the head of WAITING, retried whole next step
            num_new_tokens = min(num_new_tokens, token_budget)  # the chunked-prefill clamp
            new_blocks = self.kv_cache_manager.allocate_slots(request, num_new_tokens)
            if new_blocks is None:
                break  # no blocks: waiting requests never preempt running ones
            self.waiting.pop_request()
            (scheduled_resumed if request.status == RequestStatus.PREEMPTED else scheduled_new).append(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            num_scheduled_tokens[request.request_id] = num_new_tokens
            new_block_ids[request.request_id] = [b.block_id for b in new_blocks]
            token_budget -= num_new_tokens

        # Pack the plan, then advance the progress model (vLLM's _update_after_schedule).
        get_ids = self.kv_cache_manager.get_block_ids
        cached = CachedRequestData()
        for request in scheduled_running + scheduled_resumed:
            resumed = request in scheduled_resumed
            cached.req_ids.append(request.request_id)
            cached.resumed_from_preemption.append(resumed)
            cached.resumed_req_token_ids.append(request.all_token_ids if resumed else None)
            cached.new_block_ids.append(new_block_ids[request.request_id])
            cached.num_computed_tokens.append(request.num_computed_tokens)
        output = SchedulerOutput(
            scheduled_new_reqs=[NewRequestData(r.request_id, list(r.prompt_token_ids), r.sampling_params,
                                               get_ids(r.request_id), r.num_computed_tokens) for r in scheduled_new],
            scheduled_cached_reqs=cached,
            num_scheduled_tokens=num_scheduled_tokens,
            total_num_scheduled_tokens=sum(num_scheduled_tokens.values()),
            finished_req_ids=self.finished_req_ids,
            preempted_req_ids={r.request_id for r in preempted},
        )
        for req_id, n in num_scheduled_tokens.items():
            self.requests[req_id].num_computed_tokens += n
        self.finished_req_ids = set()
        return output

    def _num_new_tokens(self, request: Request) -> int:
        """How far num_computed_tokens is behind num_tokens, capped by long_prefill_token_threshold.

        The cap applies only with chunked prefill on (a cap on chunks: no chunking, no cap).
        """
        num_new_tokens = request.num_tokens - request.num_computed_tokens
        cfg = self.scheduler_config
        if cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold:
            num_new_tokens = min(num_new_tokens, cfg.long_prefill_token_threshold)
        return num_new_tokens

    def _preempt_request(self, request: Request) -> None:
        """Preemption by recompute: drop the KV, forget the progress, go first in line."""
        self.kv_cache_manager.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.prepend_request(request)

    def update_from_output(self, scheduler_output: SchedulerOutput,
                           model_runner_output: ModelRunnerOutput) -> EngineCoreOutputs:
        """Append sampled tokens, check stops, free what finished, report the deltas."""
        outputs: list[EngineCoreOutput] = []
        stopped: set[Request] = set()
        logprobs = model_runner_output.logprobs
        for req_id in scheduler_output.num_scheduled_tokens:
            request = self.requests.get(req_id)
            if request is None or request.is_finished():
                continue  # aborted while the step ran
            req_index = model_runner_output.req_id_to_index[req_id]
            generated = model_runner_output.sampled_token_ids[req_index]
            if not generated:
                continue  # a partial prefill chunk samples nothing
            new_token_ids = []
            for token_id in generated:
                request.output_token_ids.append(token_id)
                new_token_ids.append(token_id)
                if self._check_stop(request):
                    break
            new_logprobs = logprobs[req_index][:len(new_token_ids)] if logprobs and logprobs[req_index] else None
            if request.is_finished():
                stopped.add(request)
                self._free_request(request)
            outputs.append(EngineCoreOutput(req_id, new_token_ids, new_logprobs,
                                            request.get_finished_reason(), request.stop_reason,
                                            model_runner_output.prompt_logprobs_dict.get(req_id)))
        if stopped:
            self.running = [r for r in self.running if r not in stopped]
        return EngineCoreOutputs(outputs=outputs)

    def _check_stop(self, request: Request) -> bool:
        params = request.sampling_params
        max_tokens = params.max_tokens if params.max_tokens is not None else self.max_model_len
        if request.num_tokens >= self.max_model_len or request.num_output_tokens >= max_tokens:
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

    def finish_requests(self, request_ids, finished_status: RequestStatus) -> None:
        """Finish requests from outside the step (abort, stop string): out of the queues, blocks freed."""
        assert RequestStatus.is_finished(finished_status)
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        requests = [self.requests[i] for i in ids if i in self.requests]
        running = {r for r in requests if r.status == RequestStatus.RUNNING}
        self.running = [r for r in self.running if r not in running]
        self.waiting.remove_requests({r for r in requests if r not in running})
        for request in requests:
            request.status = finished_status
            self._free_request(request)

    def _free_request(self, request: Request) -> None:
        self.kv_cache_manager.free(request)
        self.finished_req_ids.add(request.request_id)
        del self.requests[request.request_id]

    def get_num_unfinished_requests(self) -> int:
        return len(self.waiting) + len(self.running)

    def has_unfinished_requests(self) -> bool:
        return self.get_num_unfinished_requests() > 0
