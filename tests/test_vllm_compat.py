"""Behaviour vLLM's own tests expect of the offline API: admission limits, min_tokens, stop text, logprobs, seeds."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.engine import EngineCoreOutput
from minivllm.engine.output_processor import OutputProcessor

MAX_LEN = 48


@pytest.fixture(scope="module")
def llm(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=MAX_LEN, num_gpu_blocks_override=32)
    yield llm
    llm.shutdown()


def greedy(llm, prompt, **kw):
    out = llm.generate([prompt], SamplingParams(temperature=0, **kw), use_tqdm=False)[0].outputs[0]
    return out


def all_free(llm) -> bool:
    stats = llm.llm_engine.get_stats()
    return stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1 and stats["num_unfinished"] == 0


def test_prompt_must_leave_room_for_one_output_token(llm):
    out = greedy(llm, list(range(10, 10 + MAX_LEN - 1)), max_tokens=5)
    assert len(out.token_ids) == 1 and out.finish_reason == "length"  # max_model_len reached after one token
    for n in (MAX_LEN, MAX_LEN + 1):
        with pytest.raises(ValueError, match="max_model_len"):
            greedy(llm, list(range(10, 10 + n)), max_tokens=5)
    assert all_free(llm) and len(greedy(llm, "Hello", max_tokens=2).token_ids) == 2  # the engine lives on


@pytest.mark.parametrize("priority", [[0, 0, 0], [], [0, 0, 0, 0, 0], 3])
def test_priority_of_the_wrong_length_is_refused_before_submission(llm, priority):
    with pytest.raises(ValueError, match="one int per prompt"):
        llm.generate(["a", "b", "c", "d"], SamplingParams(max_tokens=2), priority=priority, use_tqdm=False)
    assert all_free(llm) and not llm.llm_engine.has_unfinished_requests()


def test_stop_strings_are_not_matched_before_min_tokens(llm):
    free = greedy(llm, "Once upon a time", max_tokens=20, ignore_eos=True)
    early = llm.get_tokenizer().decode(free.token_ids[1:2]).strip()
    assert early, "the second greedy token should have some text"
    stopped = greedy(llm, "Once upon a time", max_tokens=20, ignore_eos=True, stop=[early])
    assert len(stopped.token_ids) <= 3 and stopped.stop_reason == early  # without min_tokens it stops at once
    held = greedy(llm, "Once upon a time", max_tokens=20, ignore_eos=True, stop=[early], min_tokens=15)
    assert len(held.token_ids) >= 15, held


def test_min_tokens_masks_stop_token_ids_and_eos_in_the_sampler(llm):
    free = greedy(llm, "Once upon a time", max_tokens=8, ignore_eos=True)
    first = free.token_ids[0]  # what greedy picks first: a stop id here would end the request at once
    masked = greedy(llm, "Once upon a time", max_tokens=8, stop_token_ids=[first], min_tokens=4)
    assert first not in masked.token_ids[:4], masked.token_ids
    # EOS joins the masked ids at submission (unless ignore_eos), as vLLM's all_stop_token_ids
    _, request = llm.llm_engine.process_inputs("x", "Hi", SamplingParams(min_tokens=2, stop_token_ids=[7]))
    assert request.sampling_params.all_stop_token_ids == {7, llm.get_tokenizer().eos_token_id}
    _, request = llm.llm_engine.process_inputs("y", "Hi", SamplingParams(ignore_eos=True))
    assert request.sampling_params.all_stop_token_ids == set()


def test_sampler_never_draws_a_masked_eos():
    from minivllm.sample.sampler import Sampler, SamplingMetadata
    logits = torch.zeros(2, 10)
    logits[:, 3] = 50.0  # EOS = 3 is by far the likeliest
    md = SamplingMetadata(temperature=torch.tensor([0.0, 1.0]), all_greedy=False, top_k=None, top_p=None,
                          min_p=None, generators=[torch.Generator().manual_seed(0)] * 2, max_num_logprobs=1,
                          min_tokens_masks=[(0, [3]), (1, [3])])
    out = Sampler()(logits, md)
    assert 3 not in out.sampled_token_ids.tolist()
    assert out.logprobs[2][:, 0].tolist() == [3, 3]  # logprobs stay those of the raw distribution


def test_stop_token_text_is_left_out_unless_asked(llm):
    free = greedy(llm, "Once upon a time", max_tokens=10, ignore_eos=True)
    tokenizer = llm.get_tokenizer()
    stop_id = free.token_ids[3]
    k = free.token_ids.index(stop_id)
    out = greedy(llm, "Once upon a time", max_tokens=10, stop_token_ids=[stop_id])
    assert out.token_ids == free.token_ids[:k + 1] and out.stop_reason == stop_id
    assert out.text == tokenizer.decode(free.token_ids[:k])
    kept = greedy(llm, "Once upon a time", max_tokens=10, stop_token_ids=[stop_id], include_stop_str_in_output=True)
    assert kept.text == tokenizer.decode(free.token_ids[:k + 1])


def test_eos_text_is_left_out_with_special_tokens_shown(tokenizer):
    processor = OutputProcessor(tokenizer)
    eos = tokenizer.eos_token_id
    hello = tokenizer.encode(" Hello")
    for include in (False, True):
        processor.add_request("r", None, tokenizer.encode("Hi"),
                              SamplingParams(skip_special_tokens=False, include_stop_str_in_output=include))
        out = processor.process_outputs([EngineCoreOutput("r", hello + [eos], None, "stop", None)])
        text = out.request_outputs[0].outputs[0].text
        assert text == (" Hello" + tokenizer.decode([eos]) if include else " Hello"), text


def test_include_stop_str_in_output_keeps_the_stop_string(llm):
    free = greedy(llm, "Once upon a time", max_tokens=12, ignore_eos=True)
    stop = free.text[len(free.text) // 2:len(free.text) // 2 + 3]
    cut = greedy(llm, "Once upon a time", max_tokens=12, ignore_eos=True, stop=[stop])
    kept = greedy(llm, "Once upon a time", max_tokens=12, ignore_eos=True, stop=[stop], include_stop_str_in_output=True)
    assert not cut.text.endswith(stop) and kept.text == cut.text + stop


def test_logprobs_put_the_sampled_token_first_then_rank_order(llm):
    params = SamplingParams(temperature=5.0, seed=11, max_tokens=12, logprobs=3, ignore_eos=True)
    out = llm.generate(["Once upon a time"], params, use_tqdm=False)[0].outputs[0]
    assert any(entry[t].rank > 3 for t, entry in zip(out.token_ids, out.logprobs)), "want an unlikely draw"
    for token_id, entry in zip(out.token_ids, out.logprobs):
        keys = list(entry)
        assert keys[0] == token_id
        others = [entry[k].rank for k in keys if k != token_id]
        assert others == sorted(others) and others[:1] == [1] or entry[token_id].rank == 1


def test_decoded_token_completes_a_multibyte_character(tokenizer):
    ids = tokenizer.encode("🙂")
    assert len(ids) > 1, "want a character split over several tokens"
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", None, tokenizer.encode("Hi"), SamplingParams(logprobs=0))
    out = processor.process_outputs([EngineCoreOutput("r", [t], [(-1.0, 1, [])], None, None) for t in ids])
    last = out.request_outputs[-1].outputs[0]
    assert last.logprobs[-1][ids[-1]].decoded_token.endswith("🙂")
    assert "".join(entry[t].decoded_token for t, entry in zip(ids, last.logprobs)).endswith("🙂")


def test_logprobs_limits_follow_max_logprobs(llm, tiny_llama_folder):
    with pytest.raises(ValueError, match="max_logprobs"):
        greedy(llm, "Hi", max_tokens=1, logprobs=21)
    with pytest.raises(ValueError, match="max_logprobs"):
        greedy(llm, "Hi", max_tokens=1, logprobs=-1)
    assert all_free(llm)
    whole = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=MAX_LEN, num_gpu_blocks_override=8,
                max_logprobs=-1)
    out = whole.generate(["Hi"], SamplingParams(temperature=0, max_tokens=1, logprobs=-1), use_tqdm=False)
    assert len(out[0].outputs[0].logprobs[0]) == whole.llm_engine.hf_config.vocab_size
    with pytest.raises(ValueError, match="logprobs"):
        greedy(whole, "Hi", max_tokens=1, logprobs=whole.llm_engine.hf_config.vocab_size + 1)
    whole.shutdown()


def test_llm_seed_seeds_the_callers_generators_in_process(tiny_llama_folder):
    draws = []
    for _ in range(2):
        llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=MAX_LEN, num_gpu_blocks_override=8,
                  seed=7)
        llm.generate(["Hi"], SamplingParams(temperature=1.0, max_tokens=3), use_tqdm=False)
        draws.append((random.randint(0, 10**9), float(np.random.rand()), float(torch.rand(1))))
        llm.shutdown()
    assert draws[0] == draws[1]
