"""Mirror of vllm/v1/attention/backends/triton_attn.py: the same two paths, as Triton kernels.

The write is `reshape_and_cache_flash` (per token, by slot_mapping); the read
is one `unified_attention` launch for the whole mixed batch (per block, by
block_table). Kernels live in minivllm/kernels/. Left out: FP8 caches, sinks.
"""
from __future__ import annotations

import torch

from minivllm import _custom_ops as ops
from minivllm.attention.backends.utils import AttentionMetadata


class TritonAttentionImpl:
    def do_kv_cache_update(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        ops.reshape_and_cache_flash(key, value, kv_cache[0], kv_cache[1], slot_mapping)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        md = attn_metadata
        ops.unified_attention(q=query, k=kv_cache[0], v=kv_cache[1], out=output,
                              cu_seqlens_q=md.query_start_loc, max_seqlen_q=md.max_query_len,
                              seqused_k=md.seq_lens, max_seqlen_k=md.max_seq_len, softmax_scale=layer.scale,
                              causal=True, block_table=md.block_table)
        return output
