"""Async scheduling: step N+1 is scheduled while step N runs (AsyncScheduler + EngineCore's batch queue).

The scheduler-level tests drive AsyncScheduler by hand, two steps in flight, as vLLM's
tests/v1/core/test_async_scheduler.py does; the engine-level ones check that the tokens and logprobs are the
ones a synchronous engine gives, over every feature the scheduler touches, and that nothing is left behind.
"""
from __future__ import annotations

from collections import deque

import pytest

from minivllm import LLM, SamplingParams
from minivllm.config import CacheConfig, EngineConfig, SchedulerConfig
from minivllm.core.sched.async_scheduler import AsyncScheduler
from minivllm.core.kv_cache_utils import get_request_block_hasher
from minivllm.engine.arg_utils import EngineArgs
from minivllm.outputs import ModelRunnerOutput
from minivllm.request import Request, RequestStatus

EOS = 2


def make_scheduler(budget=8192, num_blocks=1024, block_size=16, prefix_caching=False, max_model_len=8192):
    return AsyncScheduler(SchedulerConfig(max_num_batched_tokens=budget, max_model_len=max_model_len),
                          CacheConfig(block_size=block_size, num_gpu_blocks=num_blocks,
                                      enable_prefix_caching=prefix_caching))


def make_request(req_id, num_prompt_tokens, max_tokens=8, prompt=None, block_size=None):
    hasher = get_request_block_hasher(block_size) if block_size else None
    return Request(req_id, prompt or [7 + i % 50 for i in range(num_prompt_tokens)],
                   SamplingParams(temperature=0, max_tokens=max_tokens), EOS, block_hasher=hasher)


def run_output(so, token=5, tokens=None):
    """Play the runner: one token for every scheduled request (the prompts here fit one step)."""
    req_ids = list(so.num_scheduled_tokens)
    return ModelRunnerOutput(req_ids, {r: i for i, r in enumerate(req_ids)},
                             [[(tokens or {}).get(r, token)] for r in req_ids])


def drain(scheduler, in_flight: deque, before_update=None, tokens=None) -> list:
    """Update the oldest step in flight, then schedule the next, until nothing is left; every EngineCoreOutputs."""
    seen = []
    while in_flight:
        if before_update:
            before_update()
        so = in_flight.popleft()
        seen.append(scheduler.update_from_output(so, run_output(so, tokens=tokens)))
        nxt = scheduler.schedule()
        if nxt.num_scheduled_tokens:
            in_flight.append(nxt)
    return seen


@pytest.mark.parametrize("max_tokens", [1, 2, 3, 5])
def test_requests_stop_at_max_tokens_and_no_token_is_scheduled_past_it(max_tokens):
    s = make_scheduler()
    a, b = make_request("a", 10, max_tokens), make_request("b", 12, max_tokens)
    s.add_request(a)
    in_flight = deque([s.schedule()])
    s.add_request(b)
    in_flight.append(s.schedule())  # two steps in flight before any output is known
    total = sum(so.total_num_scheduled_tokens for so in in_flight)
    seen = []
    while in_flight:
        so = in_flight.popleft()
        s.update_from_output(so, run_output(so))
        nxt = s.schedule()
        total += nxt.total_num_scheduled_tokens
        if nxt.num_scheduled_tokens:
            in_flight.append(nxt)
        seen.append(nxt)
    assert a.num_output_tokens == b.num_output_tokens == max_tokens
    assert not s.has_unfinished_requests()
    assert total == 10 + 12 + 2 * (max_tokens - 1)  # the last token of each is sampled, never fed back
    assert s.kv_cache_manager.block_pool.get_num_free_blocks() == 1024 - 1


def test_a_request_finished_in_step_n_drops_its_token_from_step_n_plus_1():
    """EOS in step N: step N+1 was already scheduled for it (a placeholder); that token never reaches the caller."""
    s = make_scheduler()
    a, b = make_request("a", 8, max_tokens=10), make_request("b", 8, max_tokens=3)
    s.add_request(a)
    s.add_request(b)
    first = s.schedule()
    second = s.schedule()  # scheduled before step 1's tokens are known
    assert set(second.num_scheduled_tokens) == {"a", "b"} and a.num_output_placeholders == 2
    out1 = s.update_from_output(first, run_output(first, tokens={"a": EOS}))
    assert [(o.request_id, o.new_token_ids, o.finish_reason) for o in out1.outputs] == [("a", [EOS], "stop"),
                                                                                           ("b", [5], None)]
    out2 = s.update_from_output(second, run_output(second, tokens={"a": 99}))
    assert [o.request_id for o in out2.outputs] == ["b"]  # a's step-2 token (99) went nowhere
    assert a.output_token_ids == [EOS] and "a" not in s.requests
    assert "a" in s.schedule().finished_req_ids  # the runner drops its row with the next step


def test_aborts_between_steps_in_flight_leave_nothing_behind():
    s = make_scheduler(num_blocks=64)
    requests = [make_request(f"r{i}", 6 + i, max_tokens=20) for i in range(6)]
    for r in requests:
        s.add_request(r)
    in_flight = deque([s.schedule(), s.schedule()])
    order = [3, 0, 5, 1, 4, 2]

    def abort_next():
        if order:
            s.finish_requests(requests[order.pop(0)].request_id, RequestStatus.FINISHED_ABORTED)

    drain(s, in_flight, before_update=abort_next)
    for i, r in enumerate(requests):
        assert r.status == RequestStatus.FINISHED_ABORTED
        assert r.num_output_tokens == [3, 0, 5, 1, 4, 2].index(i)  # one step's token per update before its abort
    assert not s.has_unfinished_requests() and s.kv_cache_manager.block_pool.get_num_free_blocks() == 63


def test_a_request_preempted_while_its_step_ran_and_then_stopped_leaves_the_waiting_queue():
    s = make_scheduler(num_blocks=4, block_size=4)  # 3 usable blocks
    a, b = make_request("a", 4, max_tokens=1), make_request("b", 4, max_tokens=8)
    s.add_request(a)
    s.add_request(b)
    first = s.schedule()  # a and b prefill: one block each
    # a needs a second block for its placeholder; b too: the pool runs out, b (the tail) is preempted... unless a
    # already reached max_tokens in flight, in which case it is not scheduled at all
    second = s.schedule()
    assert "a" not in second.num_scheduled_tokens  # max_tokens=1 is reached by step 1 in flight
    s.update_from_output(first, run_output(first))
    s.update_from_output(second, run_output(second))
    assert a.is_finished() and a.num_output_tokens == 1
    # now preempt b while its step is in flight, and let that step's token end it
    c = make_request("c", 8, max_tokens=4)
    b.sampling_params.max_tokens = b.num_output_tokens + 1
    s.add_request(c)
    third = s.schedule()
    s._preempt_request(b)
    s.running.remove(b)
    s.update_from_output(third, run_output(third))
    assert b.is_finished() and b not in list(s.waiting)  # stopped while preempted: out of the queue, freed
    drain(s, deque([s.schedule()]))
    assert not s.has_unfinished_requests() and s.kv_cache_manager.block_pool.get_num_free_blocks() == 3


def test_prefix_caching_dedups_same_step_prompts_and_caches_blocks_as_tokens_become_known():
    s = make_scheduler(budget=1000, prefix_caching=True)
    prompt = [10 + i for i in range(100)]
    reqs = [make_request(f"r{i}", 100, max_tokens=3, prompt=prompt, block_size=16) for i in range(4)]
    s.add_request(reqs[0])
    s.add_request(reqs[1])
    first = s.schedule()
    assert first.num_scheduled_tokens == {"r0": 100, "r1": 100 % 16}  # r1 hits r0's 6 blocks in the same step
    in_flight = deque([first, s.schedule()])
    for r in reqs[2:]:
        s.add_request(r)
        so = in_flight.popleft()
        s.update_from_output(so, run_output(so))
        nxt = s.schedule()
        assert nxt.num_scheduled_tokens[r.request_id] == 100 % 16
        in_flight.append(nxt)
    drain(s, in_flight)
    assert not s.has_unfinished_requests()
    # a next turn whose prompt is a finished request's whole sequence hits every full block of it, the blocks
    # whose last token was known only after its step ran included (cached in update_from_output)
    turn = make_request("t", 0, max_tokens=2, prompt=reqs[0].all_token_ids + [3], block_size=16)
    s.add_request(turn)
    assert s.schedule().num_scheduled_tokens["t"] == len(turn.prompt_token_ids) % 16 or 16


def test_the_config_follows_vllms_defaults_and_refuses_what_vllm_refuses():
    assert EngineConfig().async_scheduling is False  # the CPU: vLLM's CPU platform turns it off
    assert EngineConfig(device="cuda").async_scheduling is True  # on by default on a GPU since vLLM 0.14
    assert EngineConfig(async_scheduling=True).async_scheduling is True  # ours: the CPU may turn it on
    with pytest.raises(ValueError, match="async scheduling is only supported with EAGLE/MTP"):
        EngineConfig(async_scheduling=True, speculative_config={"method": "ngram", "num_speculative_tokens": 2})
    import argparse
    args = EngineArgs.add_cli_args(argparse.ArgumentParser()).parse_args(["--async-scheduling"])
    assert EngineArgs.from_cli_args(args).async_scheduling is True


def _run(folder, prompts, params, **kw):
    llm = LLM(str(folder), max_model_len=256, **kw)
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
        stats = llm.llm_engine.get_stats()
        assert stats["num_unfinished"] == 0 and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1, stats
        return [[(c.token_ids, c.text, c.finish_reason,
                  None if c.logprobs is None else [sorted((k, v.logprob) for k, v in d.items()) for d in c.logprobs])
                 for c in o.outputs] for o in outs]
    finally:
        llm.shutdown()


PROMPTS = ["Once upon a time", "The capital of France is", "1, 2, 3, 4,", "def fib(n):", "Hello there, friend"]

CASES = {
    "plain": ({}, dict(max_tokens=12, logprobs=2)),
    "chunked-budget-8": (dict(max_num_batched_tokens=8), dict(max_tokens=10, logprobs=1)),
    "preempted-12-blocks": (dict(num_gpu_blocks_override=12, block_size=8), dict(max_tokens=24, ignore_eos=True)),
    "max-tokens-1": ({}, dict(max_tokens=1, logprobs=3)),
    "stop-string": ({}, dict(max_tokens=16, stop=[" the", ","])),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("multiprocess", [False, True])
def test_greedy_tokens_and_logprobs_equal_with_it_on_and_off(tiny_llama_folder, case, multiprocess):
    engine_kw, params = CASES[case]
    params = SamplingParams(temperature=0, **params)
    sync = _run(tiny_llama_folder, PROMPTS, params, multiprocess=multiprocess, **engine_kw)
    assert _run(tiny_llama_folder, PROMPTS, params, multiprocess=multiprocess, async_scheduling=True,
                **engine_kw) == sync


def test_prefix_caching_and_n3_equal_with_it_on_and_off(tiny_llama_folder):
    shared = "A long shared system prompt that fills more than one block of sixteen tokens, surely. "
    prompts = [shared + p for p in PROMPTS]
    greedy = SamplingParams(temperature=0, max_tokens=8)
    seeded = SamplingParams(temperature=0.8, n=3, seed=11, max_tokens=8)
    for params in (greedy, seeded):
        assert _run(tiny_llama_folder, prompts, params, multiprocess=False, async_scheduling=True) == \
            _run(tiny_llama_folder, prompts, params, multiprocess=False)


def test_tensor_parallel_2_equal_with_it_on_and_off(tiny_llama_folder):
    params = SamplingParams(temperature=0, max_tokens=8, logprobs=2)
    assert _run(tiny_llama_folder, PROMPTS[:3], params, tensor_parallel_size=2, multiprocess=False,
                async_scheduling=True) == \
        _run(tiny_llama_folder, PROMPTS[:3], params, tensor_parallel_size=2, multiprocess=False)


def test_aborted_request_in_flight_frees_everything(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), max_model_len=256, multiprocess=False, async_scheduling=True)
    try:
        engine = llm.llm_engine
        params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True)
        for i, p in enumerate(PROMPTS):
            engine.add_request(f"q{i}", p, params)
        for _ in range(4):
            engine.step()  # two steps in flight by now
        engine.abort_request(["q1", "q3"])
        finished = {}
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    finished[out.request_id] = len(out.outputs[0].token_ids)
        assert set(finished) == {"q0", "q2", "q4"} and set(finished.values()) == {50}
        stats = engine.get_stats()
        assert stats["num_unfinished"] == 0 and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1
    finally:
        llm.shutdown()


@pytest.mark.parametrize("on", [True, False])
def test_the_start_up_log_says_it_is_enabled(tiny_llama_folder, on, capfd, monkeypatch):
    monkeypatch.setenv("MINIVLLM_LOGGING_LEVEL", "INFO")
    LLM(str(tiny_llama_folder), max_model_len=128, multiprocess=False, async_scheduling=on).shutdown()
    assert ("INFO minivllm: Asynchronous scheduling is enabled." in capfd.readouterr().err) == on


def test_through_the_server_streamed_and_whole_equal_with_it_on_and_off(tiny_llama_folder):
    """The OpenAI server (AsyncLLM, EngineCore in its own process) with async scheduling: the same completions,
    streamed or whole, as without it, and nothing left in the engine afterwards."""
    import openai

    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    texts = {}
    for on in (False, True):
        thread = ServerThread(AsyncLLM.from_engine_args(EngineArgs(model=str(tiny_llama_folder), max_model_len=256,
                                                                   async_scheduling=on)))
        try:
            client = openai.OpenAI(base_url=thread.url, api_key="EMPTY", max_retries=0, timeout=120)
            model = client.models.list().data[0].id
            whole = [client.completions.create(model=model, prompt=p, max_tokens=10, temperature=0).choices[0].text
                     for p in PROMPTS[:3]]
            streamed = ["".join(c.choices[0].text for c in client.completions.create(
                model=model, prompt=p, max_tokens=10, temperature=0, stream=True)) for p in PROMPTS[:3]]
            assert whole == streamed
            texts[on] = whole
            stats = thread.run_coroutine(thread.engine.get_stats_async())
            assert stats["num_unfinished"] == 0 and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1
        finally:
            thread.stop()
    assert texts[True] == texts[False]


def test_a_health_check_does_not_wait_for_the_step_in_flight(tiny_llama_folder):
    """EngineCore's busy loop checks health when its input queue is empty; with a step in flight on the executor's
    thread that check must not wait for it, or nothing would ever be scheduled during a forward (a handshake: the
    step blocks on an event until the check has returned)."""
    import threading

    from minivllm.executor.uniproc_executor import UniProcExecutor
    llm = LLM(str(tiny_llama_folder), max_model_len=128, multiprocess=False, async_scheduling=True)
    try:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        assert isinstance(executor, UniProcExecutor)
        entered, release = threading.Event(), threading.Event()

        def blocked(worker):
            entered.set()
            assert release.wait(60), "the test never released the step"  # bounds a hang, never reached normally
            return "done"

        future = executor.collective_rpc(blocked, non_block=True)
        assert entered.wait(60)
        checked = threading.Thread(target=executor.check_health)
        checked.start()
        checked.join(30)
        returned_while_blocked = not checked.is_alive()
        release.set()
        assert future.result() == ["done"] and returned_while_blocked
    finally:
        llm.shutdown()


def test_a_trace_opened_after_an_async_run_numbers_its_own_steps(tiny_llama_folder):
    """A run leaves an empty step in the batch queue; a trace opened afterwards skips its update, so step 1 of the
    trace is the one that admitted the traced request, with its own packed batch."""
    from minivllm.tracing import run_traced
    llm = LLM(str(tiny_llama_folder), max_model_len=128, multiprocess=False, async_scheduling=True)
    try:
        llm.generate(PROMPTS[:2], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
        assert llm.llm_engine.engine_core.engine_core.batch_queue  # the empty step still in flight
        trace = run_traced(llm, [("Once upon a time", SamplingParams(temperature=0, max_tokens=4))])
        for step, events in trace.by_step().items():
            if "execute" in events:
                assert events["execute"]["batch"]["num_scheduled_tokens"] == \
                    list(events["schedule"]["num_scheduled_tokens"].values()), step
                applied = {o["request_id"]: o["new_token_ids"] for o in events["update"]["outputs"]}
                assert applied == {r: [t] for r, t in events["execute"]["sampled"].items()}, step
        first = trace.by_step()[1]
        assert first["schedule"]["scheduled_new_reqs"] and first["execute"]["batch"]["positions"][0] == 0
    finally:
        llm.shutdown()
