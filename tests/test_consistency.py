"""Engine-level invariants: a request's greedy tokens do not depend on how it was scheduled."""
from __future__ import annotations

import pytest

from conftest import PROMPTS
from minivllm import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def alone(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256)
    tokens = [llm.generate([p], GREEDY, use_tqdm=False)[0].outputs[0].token_ids for p in PROMPTS]
    llm.shutdown()
    return tokens


@pytest.mark.parametrize("mode,args", [
    ("batched", {}),
    ("chunked", {"max_num_batched_tokens": 5}),
    ("preempted", {"num_gpu_blocks_override": 10, "block_size": 8}),
    ("one-at-a-time", {"max_num_seqs": 1}),
    ("priority", {"scheduling_policy": "priority", "num_gpu_blocks_override": 10, "block_size": 8}),
])
def test_greedy_tokens_are_the_same_alone_batched_chunked_or_preempted(alone, tiny_llama_folder, mode, args):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256, **args)
    outputs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == alone
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1
    if "num_gpu_blocks_override" in args:
        assert stats["num_preemptions"] > 0


def test_seeded_sampling_gives_the_same_tokens_in_any_batch_and_under_preemption(tiny_llama_folder):
    seeded = SamplingParams(temperature=0.9, top_p=0.95, min_p=0.01, seed=42, max_tokens=12, ignore_eos=True)
    noise = SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)
    results = []
    for args in ({}, {"num_gpu_blocks_override": 10, "block_size": 8}, {"max_num_batched_tokens": 3}):
        llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256, **args)
        crowd = llm.generate(PROMPTS[:4], [noise, seeded, noise, noise], use_tqdm=False)
        results.append(crowd[1].outputs[0].token_ids)
        llm.shutdown()
    assert results[0] == results[1] == results[2]
