"""The Triton KV write and unified attention compiled for a GPU, against the float64 reference of test_kernels.

The article's shapes (SmolLM2: 9 query heads, 3 KV heads, head_dim 64, block_size 16) and a large one
(32 query heads, head_dim 128, block_size 16, 4k-token context) in float32, bfloat16 and float16. Inputs are
rounded to the dtype first, so the tolerance measures the kernel's arithmetic, not the rounding of its inputs.
"""
from __future__ import annotations

import math

import pytest
import torch

from gpu_env import DEVICE, gpu_only, skip_without_device
from test_kernels import make_paged_batch, ref_attention  # the CPU tests' reference, reused as is

from minivllm import _custom_ops as ops

pytestmark = skip_without_device

# Relative max error allowed against float64: fp32 accumulates in fp32; bf16/fp16 outputs are rounded once more.
TOLERANCE = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}
ARTICLE = [(21, 7), (0, 11), (50, 1), (30, 1), (16, 1), (9, 0)]  # (cached, new): chunks, prefills, decodes, idle
LARGE = [(4095, 1), (3968, 128), (0, 512), (2047, 1), (1000, 33)]  # 4k context, long prefill tiles, decodes


def attend(seqs, num_q_heads, num_kv_heads, head_size, block_size, dtype, seed):
    batch = make_paged_batch(seqs, num_q_heads, num_kv_heads, head_size, block_size, seed=seed, pad_tokens=3)
    for key in ("q", "k", "v"):
        batch[key] = batch[key].to(dtype)  # the reference sees the same rounded values
    scale = 1.0 / math.sqrt(head_size)
    dev = {k: (v.to(DEVICE) if torch.is_tensor(v) else v) for k, v in batch.items()}
    out = torch.full_like(dev["q"], float("nan"))
    ops.unified_attention(dev["q"], dev["k"], dev["v"], out, dev["cu"], batch["max_q"], dev["seq_lens"],
                          batch["max_k"], scale, True, dev["block_table"])
    ref = ref_attention(batch["q"], batch["k"], batch["v"], batch["cu"], batch["seq_lens"],
                        batch["block_table"], scale, True)
    n = int(batch["cu"][-1])
    out = out.cpu()
    assert torch.isfinite(out[:n]).all(), "a valid output element was not written (or read a poisoned slot)"
    assert torch.isnan(out[n:]).all(), "padding rows must be left untouched"
    return ((out[:n].double() - ref[:n]).abs().max() / ref[:n].abs().max()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_unified_attention_at_the_articles_shapes(dtype):
    if dtype != torch.float32 and DEVICE == "cpu":
        pytest.skip("the Triton interpreter runs float32 only")
    err = attend(ARTICLE, 9, 3, 64, 16, dtype, seed=1)
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


@gpu_only
@pytest.mark.parametrize("num_kv_heads", [8, 32], ids=["gqa4", "mha"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_unified_attention_32_heads_head_dim_128_at_4k_context(dtype, num_kv_heads):
    err = attend(LARGE, 32, num_kv_heads, 128, 16, dtype, seed=2)
    assert err < TOLERANCE[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("num_kv_heads,head_size,num_tokens", [(3, 64, 37), (8, 128, 4096)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_reshape_and_cache_flash_writes_exactly_its_slots(dtype, num_kv_heads, head_size, num_tokens):
    if DEVICE == "cpu" and (dtype != torch.float32 or num_tokens > 64):
        pytest.skip("the Triton interpreter: float32 and small sizes only")
    block_size = 16
    num_blocks = num_tokens // block_size + 8
    g = torch.Generator().manual_seed(num_tokens)
    kv = torch.full((2, num_blocks, block_size, num_kv_heads, head_size), -7.0, dtype=dtype)  # poison
    key = torch.randn(num_tokens, num_kv_heads, head_size, generator=g).to(dtype)
    value = torch.randn(num_tokens, num_kv_heads, head_size, generator=g).to(dtype)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[::7] = -1  # padding tokens are skipped
    expected = kv.clone()
    keep = slots >= 0
    expected[0].view(-1, num_kv_heads, head_size)[slots[keep]] = key[keep]
    expected[1].view(-1, num_kv_heads, head_size)[slots[keep]] = value[keep]
    kv_dev = kv.to(DEVICE)
    ops.reshape_and_cache_flash(key.to(DEVICE), value.to(DEVICE), kv_dev[0], kv_dev[1], slots.to(DEVICE))
    assert torch.equal(kv_dev.cpu(), expected)
