"""Mirrors vllm/attention/ops/triton_reshape_and_cache_flash.py.

Writes this step's new K/V vectors into the paged KV cache at the slots given
by `slot_mapping`. Leaves out fp8 cache dtypes (and their scales) and the
HND cache layout: only the "auto" dtype and the NHD layout are supported.
"""

import torch
import triton
import triton.language as tl

from minivllm.kernels import next_power_of_2


# Design note
#   One program copies one token: all of its kv heads, for both K and V.
#   Grid: (num_tokens,).
#   The program reads slot_mapping[token]; -1 means padding and the program
#   returns without touching the cache. Otherwise block = slot // block_size,
#   offset = slot % block_size, and the [num_kv_heads, head_size] tile is
#   stored at cache[block, offset]. No block_table is read here: the slot
#   already names the physical block (the scheduler built it from the table).
@triton.jit
def reshape_and_cache_kernel_flash(
    key_ptr,  # [num_tokens, num_kv_heads, head_size]
    value_ptr,  # [num_tokens, num_kv_heads, head_size]
    key_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache_ptr,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping_ptr,  # [num_tokens]
    k_stride_tok, k_stride_head, k_stride_d,
    v_stride_tok, v_stride_head, v_stride_d,
    kc_stride_blk, kc_stride_slot, kc_stride_head, kc_stride_d,
    vc_stride_blk, vc_stride_slot, vc_stride_head, vc_stride_d,
    num_kv_heads,
    head_size,
    block_size,
    HEADS_PAD: tl.constexpr,  # next_power_of_2(num_kv_heads)
    HEAD_SIZE_PAD: tl.constexpr,  # next_power_of_2(head_size)
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    if slot < 0:  # padding token: leave the cache alone
        return
    block = slot // block_size
    offset = slot % block_size

    h = tl.arange(0, HEADS_PAD)[:, None]  # [HEADS_PAD, 1]
    d = tl.arange(0, HEAD_SIZE_PAD)[None, :]  # [1, HEAD_SIZE_PAD]
    mask = (h < num_kv_heads) & (d < head_size)  # [HEADS_PAD, HEAD_SIZE_PAD]

    k = tl.load(key_ptr + token * k_stride_tok + h * k_stride_head + d * k_stride_d,
                mask=mask)  # [HEADS_PAD, HEAD_SIZE_PAD]
    v = tl.load(value_ptr + token * v_stride_tok + h * v_stride_head + d * v_stride_d,
                mask=mask)  # [HEADS_PAD, HEAD_SIZE_PAD]

    kc_base = block * kc_stride_blk + offset * kc_stride_slot  # int64 scalar
    vc_base = block * vc_stride_blk + offset * vc_stride_slot  # int64 scalar
    tl.store(key_cache_ptr + kc_base + h * kc_stride_head + d * kc_stride_d,
             k.to(key_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(value_cache_ptr + vc_base + h * vc_stride_head + d * vc_stride_d,
             v.to(value_cache_ptr.dtype.element_ty), mask=mask)


def triton_reshape_and_cache_flash(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping: torch.Tensor,  # [num_tokens] int32/int64, -1 = skip
) -> None:
    """Launch the write kernel; tensors may be strided views (no copies made)."""
    num_tokens, num_kv_heads, head_size = key.shape
    assert value.shape == key.shape, (value.shape, key.shape)
    assert key_cache.shape == value_cache.shape
    assert key_cache.shape[2:] == (num_kv_heads, head_size), key_cache.shape
    assert slot_mapping.numel() >= num_tokens
    if num_tokens == 0:
        return
    reshape_and_cache_kernel_flash[(num_tokens,)](
        key, value, key_cache, value_cache, slot_mapping,
        *key.stride(), *value.stride(),
        *key_cache.stride(), *value_cache.stride(),
        num_kv_heads, head_size, key_cache.shape[1],
        HEADS_PAD=next_power_of_2(num_kv_heads),
        HEAD_SIZE_PAD=next_power_of_2(head_size),
    )
