"""Bad input is refused where it is typed, with the fix named; the engine is never touched by it.

One test per row of the robustness issue that is about input (the process-boundary rows are in
test_failures.py, the untrusted files in test_untrusted_files.py).
"""
from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine.core_client import EngineDeadError

VOCAB = 49152


@pytest.fixture(scope="module", params=[False, True], ids=["in-process", "multiprocess"])
def llm(request, tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=request.param, max_model_len=64, num_gpu_blocks_override=32,
              scheduling_policy="priority")
    yield llm
    llm.shutdown()


def still_serves(llm) -> bool:
    stats = llm.llm_engine.get_stats()
    out = llm.generate(["Hello"], SamplingParams(max_tokens=2, temperature=0), use_tqdm=False)
    return stats["num_unfinished"] == 0 and len(out[0].outputs[0].token_ids) == 2


@pytest.mark.parametrize("params,match", [
    (dict(logprobs=VOCAB + 1), "logprobs"),
    (dict(logprobs=21), "max_logprobs"),
])
def test_oversized_logprobs_are_refused_at_submission(llm, params, match):
    with pytest.raises(ValueError, match=match):
        llm.generate(["Hello"], SamplingParams(max_tokens=2, **params), use_tqdm=False)
    assert still_serves(llm)


def test_seed_and_top_k_beyond_their_range(llm):
    with pytest.raises(ValueError, match="seed"):
        SamplingParams(seed=2**64)
    out = llm.generate(["Hello"], SamplingParams(max_tokens=3, top_k=2**63, seed=2**64 - 1), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 3  # top_k above the vocabulary means all of it, as vLLM
    assert still_serves(llm)


@pytest.mark.parametrize("priority", [[None, 0], [0.5, 0], ["1", 0], [True, 0]])
def test_priorities_that_are_not_ints_are_refused_before_submission(llm, priority):
    with pytest.raises(ValueError, match="priority"):
        llm.generate(["a", "b"], SamplingParams(max_tokens=2), priority=priority, use_tqdm=False)
    assert still_serves(llm)


def test_dict_prompts_are_served_as_vllm_serves_them(llm):
    params = SamplingParams(max_tokens=4, temperature=0)
    ids = llm.get_tokenizer().encode("Hello there")
    text, tokens, plain = llm.generate([{"prompt": "Hello there"}, {"prompt_token_ids": ids}, "Hello there"],
                                       params, use_tqdm=False)
    assert text.prompt == "Hello there" and text.prompt_token_ids == ids
    assert tokens.prompt is None and tokens.prompt_token_ids == ids
    assert text.outputs[0].token_ids == tokens.outputs[0].token_ids == plain.outputs[0].token_ids
    for bad, match in (({"text": "Hello"}, "prompt_token_ids"), ({"prompt": 5}, "string"),
                       ({"prompt_token_ids": "1 2"}, "list of ints")):
        with pytest.raises(ValueError, match=match):
            llm.generate([bad], params, use_tqdm=False)


@pytest.mark.parametrize("ids", [[True, False], [1.0, 2.0], [-1, 5], [VOCAB]])
def test_token_ids_must_be_ints_in_the_vocabulary(llm, ids):
    with pytest.raises(ValueError, match="token ids"):
        llm.generate([ids], SamplingParams(max_tokens=2), use_tqdm=False)


@pytest.mark.parametrize("messages,match", [
    ("Hello", "conversation"), ([], "conversation"), ([{"role": "user"}], "content"),
    ([{"content": "hi"}], "role"), (["Hello"], "message dicts"), ([{"role": "user", "content": 3}], "content"),
])
def test_chat_messages_are_checked(llm, messages, match):
    with pytest.raises(ValueError, match=match):
        llm.chat(messages, use_tqdm=False)


@pytest.mark.parametrize("argument,value,kind", [
    ("max_num_seqs", "4", "an int"), ("max_num_seqs", 2.5, "an int"), ("block_size", "16", "an int"),
    ("max_num_batched_tokens", True, "an int"), ("enable_chunked_prefill", "no", "True or False"),
    ("seed", None, "an int"), ("max_model_len", 1.5, "an int or None"), ("dtype", 32, "a string"),
    ("gpu_memory_utilization", "0.5", "a finite number"), ("profiler_config", "torch", "a dict"),
])
def test_engine_arguments_of_the_wrong_type_name_the_argument(argument, value, kind):
    with pytest.raises(ValueError, match=f"{argument} must be {kind}"):
        LLM(**{argument: value})  # refused before any model is looked at


def test_unknown_device_is_refused_before_the_model_loads():
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        LLM(device="bogus")


@pytest.mark.parametrize("argument,value", [
    ("num_gpu_blocks_override", 10**9), ("kv_cache_memory_bytes", 2**40), ("max_num_seqs", 10**7),
])
def test_sizes_beyond_the_machines_memory_are_refused_up_front(tiny_llama_folder, argument, value):
    with pytest.raises(ValueError, match=rf"{argument}.*GiB.*available"):
        LLM(str(tiny_llama_folder), multiprocess=True, max_model_len=512, **{argument: value})


def test_generate_after_shutdown_says_it_was_shut_down(tiny_llama_folder):
    for multiprocess in (False, True):
        llm = LLM(str(tiny_llama_folder), multiprocess=multiprocess, max_model_len=64)
        llm.shutdown()
        with pytest.raises(EngineDeadError, match="shut down"):
            llm.generate(["Hello"], SamplingParams(max_tokens=2), use_tqdm=False)
