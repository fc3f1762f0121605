"""The scheduler, driven by hand without a model, on the article's numbers.

Prefix caching is on (the default) but these requests carry no block hasher, as if built outside
EngineCore, so nothing is hashed and nothing hits: each test sees the plain allocator. The cache has
its own tests in test_prefix_caching.py.
"""
from __future__ import annotations

import pytest

from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core.sched.scheduler import Scheduler
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams

EOS = 2


def make_scheduler(budget=8192, num_blocks=1024, block_size=16, chunked=True, max_num_seqs=256, policy="fcfs",
                   max_model_len=8192, threshold=0):
    return Scheduler(SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_num_seqs,
                                     max_model_len=max_model_len, enable_chunked_prefill=chunked,
                                     long_prefill_token_threshold=threshold, policy=policy),
                     CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks))


def make_request(req_id, num_prompt_tokens, max_tokens=8, priority=0, arrival=0.0):
    return Request(req_id, [7] * num_prompt_tokens, SamplingParams(temperature=0, max_tokens=max_tokens), EOS,
                   priority=priority, arrival_time=arrival)


def sample(scheduler, so, token=5):
    """Play the model runner: one token for each request whose step reached its last known token."""
    req_ids = list(so.num_scheduled_tokens)
    sampled = [[token] if scheduler.requests[r].num_computed_tokens >= scheduler.requests[r].num_tokens else []
               for r in req_ids]
    return scheduler.update_from_output(so, ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)}, sampled))


def test_fresh_pool_hands_out_blocks_1_2_3_and_keeps_block_0_reserved():
    s = make_scheduler(num_blocks=10)
    s.add_request(make_request("A", 40))  # 40 tokens -> 3 blocks of 16
    s.schedule()
    assert s.kv_cache_manager.get_block_ids("A") == [1, 2, 3]
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 10 - 1 - 3


def test_finished_request_returns_blocks_to_the_tail_in_reverse():
    s = make_scheduler(num_blocks=10)
    s.add_request(make_request("A", 40))
    s.schedule()
    s.finish_requests("A", RequestStatus.FINISHED_ABORTED)
    free = [b.block_id for b in s.kv_cache_manager.block_pool.free_block_queue.get_all_free_blocks()]
    assert free == [4, 5, 6, 7, 8, 9, 3, 2, 1]


def test_5000_token_prompt_with_2000_left_is_chunked():
    s = make_scheduler(budget=8192)
    s.add_request(make_request("first", 6192))
    s.add_request(make_request("long", 5000))
    so = s.schedule()
    assert so.num_scheduled_tokens == {"first": 6192, "long": 2000}  # min(5000, 2000)
    assert s.requests["long"].num_computed_tokens == 2000 and s.requests["long"].status == RequestStatus.RUNNING
    sample(s, so)
    so = s.schedule()  # next step: "first" decodes 1, "long" continues with the remaining 3000
    assert so.num_scheduled_tokens == {"first": 1, "long": 3000}


def test_5000_token_prompt_without_chunking_breaks_and_stays_waiting():
    s = make_scheduler(budget=8192, chunked=False)
    s.add_request(make_request("first", 6192))
    s.add_request(make_request("long", 5000))
    so = s.schedule()
    assert so.num_scheduled_tokens == {"first": 6192}
    assert [r.request_id for r in s.waiting] == ["long"]  # break: kept, not dropped
    assert s.requests["long"].num_computed_tokens == 0
    sample(s, so)
    so = s.schedule()
    assert so.num_scheduled_tokens == {"first": 1, "long": 5000}  # retried whole


def test_running_is_served_before_waiting():
    s = make_scheduler(budget=10)
    for r in ("A", "B"):
        s.add_request(make_request(r, 4))
    sample(s, s.schedule())  # A and B prefilled, now RUNNING
    s.add_request(make_request("C", 20))
    so = s.schedule()
    assert list(so.num_scheduled_tokens) == ["A", "B", "C"]
    assert so.num_scheduled_tokens == {"A": 1, "B": 1, "C": 8}  # C gets what RUNNING left of the budget
    assert [r.req_id for r in so.scheduled_new_reqs] == ["C"]
    assert so.scheduled_cached_reqs.req_ids == ["A", "B"]


def test_allocation_failure_preempts_the_tail_and_prepends_it():
    s = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks of 4 tokens
    for r in ("A", "B", "C"):
        s.add_request(make_request(r, 4, max_tokens=8))
    sample(s, s.schedule())  # each holds one full block
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 0
    s.add_request(make_request("D", 4, max_tokens=8))
    so = s.schedule()  # A needs a 2nd block: C (the tail) is preempted; then B needs one: B goes too
    assert so.preempted_req_ids == {"C", "B"}
    assert list(so.num_scheduled_tokens) == ["A"]
    assert [r.request_id for r in s.waiting] == ["B", "C", "D"]  # prepended ahead of the new arrival
    for r in ("B", "C"):
        req = s.requests[r]
        assert req.status == RequestStatus.PREEMPTED and req.num_computed_tokens == 0
        assert s.kv_cache_manager.get_block_ids(r) == []
    assert so.scheduled_new_reqs == []  # no admissions in a step that preempted


def test_preempted_request_resumes_with_a_full_recompute():
    s = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks
    for r in ("A", "B"):
        s.add_request(make_request(r, 4, max_tokens=3))
    sample(s, s.schedule())  # one block each, one left
    so = s.schedule()  # A takes the last block; B finds none and, as the tail, preempts itself
    assert so.preempted_req_ids == {"B"} and list(so.num_scheduled_tokens) == ["A"]
    sample(s, so)
    so = s.schedule()
    assert list(so.num_scheduled_tokens) == ["A"]  # B needs 2 blocks, only 1 is free
    sample(s, so)  # A reaches max_tokens and returns its blocks
    so = s.schedule()
    assert so.scheduled_cached_reqs.req_ids == ["B"]
    assert so.scheduled_cached_reqs.resumed_from_preemption == [True]
    assert so.num_scheduled_tokens == {"B": 5}  # 4 prompt + 1 output, recomputed from scratch


def test_priority_policy_preempts_the_lowest_priority():
    s = make_scheduler(num_blocks=4, block_size=4, policy="priority")
    s.add_request(make_request("low", 4, priority=5, arrival=0))
    s.add_request(make_request("high", 4, priority=0, arrival=1))
    s.add_request(make_request("mid", 4, priority=1, arrival=2))
    so = s.schedule()
    assert list(so.num_scheduled_tokens) == ["high", "mid", "low"]
    sample(s, so)
    so = s.schedule()  # every running request needs a new block; victims are taken by priority
    assert "low" in so.preempted_req_ids and "high" in so.num_scheduled_tokens


def test_max_num_seqs_caps_running():
    s = make_scheduler(max_num_seqs=2)
    for r in "ABC":
        s.add_request(make_request(r, 4))
    assert list(s.schedule().num_scheduled_tokens) == ["A", "B"]


def test_long_prefill_token_threshold_caps_one_request_per_step():
    s = make_scheduler(threshold=100)
    s.add_request(make_request("A", 250))
    assert s.schedule().num_scheduled_tokens == {"A": 100}


def test_a_request_that_can_never_fit_is_refused_at_admission():
    s = make_scheduler(num_blocks=5, block_size=16, max_model_len=100)
    with pytest.raises(ValueError, match="max_model_len"):
        s.add_request(make_request("too-long", 101))
    with pytest.raises(ValueError, match="KV blocks"):
        s.add_request(make_request("too-big", 60, max_tokens=30))  # 89 slots -> 6 blocks > 4
    assert not s.has_unfinished_requests()


def test_stop_conditions_eos_stop_token_and_length():
    s = make_scheduler()
    s.add_request(Request("eos", [7] * 4, SamplingParams(max_tokens=10), EOS))
    s.add_request(Request("stop-id", [7] * 4, SamplingParams(max_tokens=10, stop_token_ids=[2]), None))
    s.add_request(Request("length", [7] * 4, SamplingParams(max_tokens=1), EOS))
    outs = {o.request_id: o for o in sample(s, s.schedule(), token=EOS).outputs}
    assert outs["eos"].finish_reason == "stop" and outs["eos"].stop_reason is None
    assert outs["stop-id"].finish_reason == "stop" and outs["stop-id"].stop_reason == 2
    assert outs["length"].finish_reason == "length"
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 1023 and not s.running


def test_vllms_scheduler_test_api_num_reqs_get_usage_and_handle_stopped_request():
    """Names vLLM's own scheduler and prefix-caching tests use, and the one the article quotes in update_from_output
    (`finished = self._handle_stopped_request(request)` before `_free_request`)."""
    s = make_scheduler(num_blocks=11, block_size=16)  # 10 usable blocks
    pool = s.kv_cache_manager.block_pool
    assert pool.get_usage() == 0.0
    s.add_request(make_request("A", 40, max_tokens=1))  # 3 blocks
    s.add_request(make_request("B", 8))
    so = s.schedule()
    assert so.scheduled_cached_reqs.num_reqs == 0 and len(so.scheduled_new_reqs) == 2
    assert pool.get_usage() == pytest.approx(4 / 10) == s.kv_cache_manager.usage
    stopped_seen = []
    original = s._handle_stopped_request
    s._handle_stopped_request = lambda request: stopped_seen.append(request.request_id) or original(request)
    sample(s, so)  # A reaches max_tokens=1: stopped, then finished and freed
    assert stopped_seen == ["A"] and "A" not in s.requests and pool.get_usage() == pytest.approx(1 / 10)
    so = s.schedule()
    assert so.scheduled_cached_reqs.num_reqs == 1 and so.scheduled_cached_reqs.req_ids == ["B"]


def test_a_stop_that_is_not_finished_keeps_its_blocks():
    """vLLM's contract: _handle_stopped_request returning False (a resumable session) means no _free_request."""
    s = make_scheduler(num_blocks=11)
    s.add_request(make_request("A", 8, max_tokens=1))
    so = s.schedule()
    s._handle_stopped_request = lambda request: False
    sample(s, so)
    assert "A" in s.requests and s.kv_cache_manager.get_block_ids("A") == [1]
