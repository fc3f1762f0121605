"""Greedy minivllm equals HF transformers' greedy generate(), token for token.

The same eight prompts run together: plainly, with a token budget so small that
every prompt is chunked, and with a block pool so small that requests are
preempted and recomputed. Then the same for tiny random OPT and Llama models.
"""
from __future__ import annotations

import pytest

from conftest import PROMPTS, hf_greedy
from minivllm import LLM, SamplingParams, _C

MAX_TOKENS = 20


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def hf_reference(smollm_folder, prompt_ids):
    return hf_greedy(smollm_folder, prompt_ids, MAX_TOKENS)


def run_engine(folder, prompt_ids, **engine_args):
    llm = LLM(str(folder) if folder else None, multiprocess=False, **engine_args)
    outputs = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1, "blocks leaked after the run"
    return [o.outputs[0].token_ids for o in outputs], stats


def test_smollm2_greedy_matches_hf(prompt_ids, hf_reference):
    tokens, _ = run_engine(None, prompt_ids)
    assert tokens == hf_reference


def test_smollm2_greedy_matches_hf_with_every_prompt_chunked(prompt_ids, hf_reference):
    budget = min(len(p) for p in prompt_ids) - 1
    assert all(len(p) > budget for p in prompt_ids)  # every prompt is split over several steps
    tokens, _ = run_engine(None, prompt_ids, max_num_batched_tokens=budget)
    assert tokens == hf_reference


def test_smollm2_greedy_matches_hf_under_preemption(prompt_ids, hf_reference):
    tokens, stats = run_engine(None, prompt_ids, num_gpu_blocks_override=8)
    assert stats["num_preemptions"] > 0, "the pool was meant to be too small for all requests at once"
    assert tokens == hf_reference


def test_smollm2_greedy_matches_hf_on_the_pytorch_path(prompt_ids, hf_reference, monkeypatch):
    """Without the compiled CPU ops (no compiler, or MINIVLLM_CPU_KERNELS=0) every op takes its PyTorch line."""
    monkeypatch.setattr(_C, "_lib", None)
    monkeypatch.setattr(_C, "_tried", True)
    assert not _C.available()
    tokens, _ = run_engine(None, prompt_ids, max_num_batched_tokens=min(len(p) for p in prompt_ids) - 1)
    assert tokens == hf_reference


@pytest.mark.parametrize("mode", ["plain", "chunked", "preempted"])
def test_tiny_random_models_match_hf(mode, tiny_llama_folder, tiny_opt_folder, tokenizer):
    args = {"plain": {}, "chunked": {"max_num_batched_tokens": 3},
            "preempted": {"num_gpu_blocks_override": 8}}[mode]
    prompt_ids = [tokenizer.encode(p) for p in PROMPTS]
    for folder in (tiny_llama_folder, tiny_opt_folder):
        reference = hf_greedy(folder, prompt_ids, MAX_TOKENS)
        tokens, stats = run_engine(folder, prompt_ids, **args)
        assert tokens == reference, folder.name
        if mode == "preempted":
            assert stats["num_preemptions"] > 0


def test_the_converted_gguf_folder_names_its_architecture(smollm_folder):
    """HF's from_pretrained and vLLM look up `architectures`; transformers' GGUF loader leaves it null."""
    import json
    assert json.loads((smollm_folder / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
