"""attention_backend="triton" (interpreted on the CPU) generates what the PyTorch backend does.

Run through the real engine, including steps that mix a prefill chunk with decodes.
"""
from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from minivllm import LLM, SamplingParams  # noqa: E402
from minivllm.attention.selector import get_attn_backend_name  # noqa: E402


def greedy_tokens(folder, backend, prompts, max_tokens, **args):
    llm = LLM(str(folder) if folder else None, multiprocess=False, attention_backend=backend, **args)
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=max_tokens), use_tqdm=False)
    llm.shutdown()
    return [o.outputs[0].token_ids for o in outputs]


def test_triton_matches_torch_on_tiny_llama_with_mixed_steps(tiny_llama_folder):
    # budget 8: the long prompt is chunked while the short ones already decode -> mixed steps
    prompts = ["Once upon a time", "The quick brown fox jumps over the lazy dog. The quick brown fox", "Hi there"]
    args = dict(max_num_batched_tokens=8, max_model_len=256, block_size=16)
    assert greedy_tokens(tiny_llama_folder, "triton", prompts, 6, **args) == \
        greedy_tokens(tiny_llama_folder, "torch", prompts, 6, **args)


def test_triton_matches_torch_on_smollm2():
    prompts = ["Once upon a time", "In a paged KV cache, every request owns a list of physical blocks"]
    args = dict(max_num_batched_tokens=10, max_model_len=512)
    assert greedy_tokens(None, "triton", prompts, 3, **args) == greedy_tokens(None, "torch", prompts, 3, **args)


def test_backend_selection(monkeypatch):
    monkeypatch.delenv("MINIVLLM_ATTENTION_BACKEND", raising=False)
    from minivllm import _C
    assert get_attn_backend_name(None, "cpu") == ("cpu" if _C.available() else "torch")
    assert get_attn_backend_name(None, "cuda") == "triton"
    monkeypatch.setenv("MINIVLLM_ATTENTION_BACKEND", "triton")
    assert get_attn_backend_name(None, "cpu") == "triton"
    assert get_attn_backend_name("torch", "cpu") == "torch"
    with pytest.raises(ValueError, match="attention backend"):
        get_attn_backend_name("flash", "cpu")
