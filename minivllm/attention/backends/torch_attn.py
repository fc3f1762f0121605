"""The PyTorch reference backend: write K/V by slot_mapping, read history by block_table.

Plays the role of vLLM's CPU attention backend (csrc/cpu/cpu_attn_impl.hpp):
the same two address structures, in tensor ops. All single-token decodes of a
step are served by one batched gather + SDPA; each prefill chunk gathers its
own history (few per step). Left out: sliding windows, ALiBi, soft-capping,
quantized caches.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from minivllm.attention.backends.utils import AttentionMetadata


def gather_history(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The read path: logical block j lives in physical block block_table_row[j].

    cache [num_blocks, block_size, H, D], block_table_row [>= cdiv(seq_len, block_size)] -> [seq_len, H, D]
    """
    block_size = cache.shape[1]
    num_blocks = -(-seq_len // block_size)
    physical = block_table_row[:num_blocks].long()  # physical = block_table[logical]
    return cache[physical].flatten(0, 1)[:seq_len]


class TorchAttentionImpl:
    def do_kv_cache_update(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """The write path: token i's K/V lands in slot slot_mapping[i] (-1 is padding, skipped)."""
        num_kv_heads, head_size = key.shape[1:]
        valid = slot_mapping >= 0
        if not bool(valid.all()):
            key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
        kv_cache[0].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, key)
        kv_cache[1].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, value)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        md = attn_metadata
        key_cache, value_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, num_kv_heads, head_size]
        block_size = key_cache.shape[1]
        qsl, seq_lens = md.query_start_loc_cpu, md.seq_lens_cpu
        decodes = [i for i in range(md.num_reqs) if qsl[i + 1] - qsl[i] == 1]
        if decodes:
            tokens = torch.tensor([qsl[i] for i in decodes], device=query.device)  # [num_decodes]
            max_len = max(seq_lens[i] for i in decodes)
            num_blocks = -(-max_len // block_size)
            rows = md.block_table[decodes, :num_blocks].long()  # [num_decodes, num_blocks]
            k = key_cache[rows].flatten(1, 2).transpose(1, 2)  # [num_decodes, num_kv_heads, L, head_size]
            v = value_cache[rows].flatten(1, 2).transpose(1, 2)
            lens = md.seq_lens[decodes].unsqueeze(1)  # [num_decodes, 1]
            mask = torch.arange(k.shape[2], device=query.device).unsqueeze(0) < lens  # [num_decodes, L]
            q = query[tokens].unsqueeze(2)  # [num_decodes, num_heads, 1, head_size]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :], scale=layer.scale,
                                                 enable_gqa=True)
            output[tokens] = out.squeeze(2)
        for i in range(md.num_reqs):
            start, end, seq_len = qsl[i], qsl[i + 1], seq_lens[i]
            query_len = end - start
            if query_len <= 1:
                continue
            k = gather_history(key_cache, md.block_table[i], seq_len).transpose(0, 1)  # [num_kv_heads, L, D]
            v = gather_history(value_cache, md.block_table[i], seq_len).transpose(0, 1)
            q = query[start:end].transpose(0, 1)  # [num_heads, query_len, head_size]
            if query_len == seq_len:  # no history: plain causal
                out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=layer.scale, enable_gqa=True)
            else:  # query token j sits at position seq_len - query_len + j and sees keys up to it
                q_pos = torch.arange(seq_len - query_len, seq_len, device=query.device).unsqueeze(1)
                mask = torch.arange(seq_len, device=query.device).unsqueeze(0) <= q_pos  # [query_len, L]
                out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=layer.scale, enable_gqa=True)
            output[start:end] = out.transpose(0, 1)
        return output
