"""Mirrors vllm/_custom_ops.py.

Thin Python entry points that the attention backend calls for the two
kernel ops minivllm needs (KV-cache write, paged attention), backed by our
Triton kernels. Leaves out the torch.ops C++/CUDA registrations, fp8 KV cache
dtypes and every op unrelated to attention.
"""

from typing import Optional

import torch

# Importing the package first sets TRITON_INTERPRET on CPU-only machines,
# before any @triton.jit kernel below gets decorated.
import minivllm.kernels  # noqa: F401
from minivllm.kernels.reshape_and_cache import triton_reshape_and_cache_flash
from minivllm.kernels.unified_attention import unified_attention as _unified_attention


def reshape_and_cache_flash(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping: torch.Tensor,  # [num_tokens], slot = block * block_size + offset; -1 = skip
    kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """Write token i's K/V to cache slot slot_mapping[i] (in place)."""
    if kv_cache_dtype != "auto":
        raise NotImplementedError(
            f"kv_cache_dtype={kv_cache_dtype!r} is not supported by minivllm; "
            "only 'auto' (cache dtype == model dtype) is implemented")
    del k_scale, v_scale  # only meaningful for fp8 caches
    triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping)


def unified_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_size]
    k: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    v: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    out: torch.Tensor,  # [num_tokens, num_q_heads, head_size]
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32 (query_start_loc)
    max_seqlen_q: int,
    seqused_k: torch.Tensor,  # [num_seqs] int32 (seq_lens, incl. new tokens)
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    block_table: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32
) -> None:
    """Paged attention over a mixed prefill/decode batch; writes `out` in place."""
    _unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k,
                       max_seqlen_k, softmax_scale, causal, block_table)
