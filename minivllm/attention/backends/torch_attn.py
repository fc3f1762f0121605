"""The PyTorch reference backend: write K/V by slot_mapping, read history by block_table, in tensor ops only.

The same two address structures as vLLM's attention backends, in plain torch:
single-token decodes are served in groups by one batched gather + SDPA each,
and each prefill chunk attends with SDPA over its history (gathered only if it
has any). It serves any dtype on any device and is what the other backends are
tested against; cpu_attn.py runs the compiled kernel instead. Left out:
sliding windows, ALiBi, soft-capping, quantized caches.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from minivllm.attention.backends.utils import AttentionMetadata
from minivllm.utils.math_utils import cdiv


def gather_history(cache: torch.Tensor, block_table_row: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The read path: logical block j lives in physical block block_table_row[j].

    cache [num_blocks, block_size, H, D], block_table_row [>= cdiv(seq_len, block_size)] -> [seq_len, H, D]
    """
    num_blocks = cdiv(seq_len, cache.shape[1])
    return gather_blocks(cache, block_table_row[:num_blocks]).flatten(0, 1)[:seq_len]


def gather_blocks(cache: torch.Tensor, physical: torch.Tensor) -> torch.Tensor:
    """cache [num_blocks, block_size, H, D], physical [...] block ids -> [..., block_size, H, D].

    index_select on a [num_blocks, block_size * H * D] view copies whole blocks, a memcpy each, where the
    equivalent advanced indexing `cache[physical]` goes element by element on the CPU.
    """
    flat = cache.view(cache.shape[0], -1)
    return flat.index_select(0, physical.reshape(-1)).view(*physical.shape, *cache.shape[1:])


@dataclass
class DecodeGroup:
    tokens: torch.Tensor  # [n] row of each decode token in the packed batch
    rows: torch.Tensor  # [n, num_blocks] their block_table rows, cut to the group's longest history
    mask: torch.Tensor  # [n, 1, 1, L] which gathered positions are real history


@dataclass
class PrefillChunk:
    start: int
    end: int
    req_index: int
    seq_len: int
    mask: torch.Tensor | None  # [query_len, L] causal mask offset by the cached history; None: plain causal


def plan_step(md: AttentionMetadata, block_size: int, group_size: int) -> tuple[list[DecodeGroup], list[PrefillChunk]]:
    """Split one step's requests into decode groups and prefill chunks; built once, used by every layer.

    Decodes are sorted by length and grouped, so each group's gather pads only to its own longest history.
    """
    qsl, seq_lens, device = md.query_start_loc_cpu, md.seq_lens_cpu, md.seq_lens.device
    decodes = sorted((i for i in range(md.num_reqs) if qsl[i + 1] - qsl[i] == 1), key=seq_lens.__getitem__)
    groups = []
    for g in range(0, len(decodes), group_size):
        members = decodes[g:g + group_size]
        num_blocks = cdiv(seq_lens[members[-1]], block_size)
        lens = md.seq_lens[members].unsqueeze(1)  # [n, 1]
        mask = torch.arange(num_blocks * block_size, device=device).unsqueeze(0) < lens  # [n, L]
        groups.append(DecodeGroup(torch.tensor([qsl[i] for i in members], device=device),
                                  md.block_table[members, :num_blocks], mask[:, None, None, :]))
    chunks = []
    for i in range(md.num_reqs):
        start, end, seq_len = qsl[i], qsl[i + 1], seq_lens[i]
        if end - start <= 1:
            continue
        mask = None
        if end - start < seq_len:  # query token j sits at position seq_len - query_len + j, sees keys up to it
            q_pos = torch.arange(seq_len - (end - start), seq_len, device=device).unsqueeze(1)
            mask = torch.arange(seq_len, device=device).unsqueeze(0) <= q_pos  # [query_len, L]
        chunks.append(PrefillChunk(start, end, i, seq_len, mask))
    return groups, chunks


class TorchAttentionImpl:
    DECODE_GROUP = 8  # decodes per batched gather + SDPA

    def __init__(self) -> None:
        self._plan: tuple[AttentionMetadata, tuple] | None = None  # (the step's metadata, its plan)

    def do_kv_cache_update(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """The write path: token i's K/V lands in slot slot_mapping[i] (-1 is padding, skipped)."""
        num_kv_heads, head_size = key.shape[1:]
        if slot_mapping.numel() and int(slot_mapping.min()) < 0:
            valid = slot_mapping >= 0
            key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
        kv_cache[0].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, key)
        kv_cache[1].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, value)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        """The read path: each request's history is found block by block through its block_table row."""
        key_cache, value_cache = kv_cache[0], kv_cache[1]  # [num_blocks, block_size, num_kv_heads, head_size]
        if self._plan is None or self._plan[0] is not attn_metadata:  # planned once per step, for every layer
            self._plan = (attn_metadata, plan_step(attn_metadata, key_cache.shape[1], self.DECODE_GROUP))
        groups, chunks = self._plan[1]
        for g in groups:
            k = gather_blocks(key_cache, g.rows).flatten(1, 2).transpose(1, 2)  # [n, num_kv_heads, L, head_size]
            v = gather_blocks(value_cache, g.rows).flatten(1, 2).transpose(1, 2)
            q = query[g.tokens].unsqueeze(2)  # [n, num_heads, 1, head_size]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=g.mask, scale=layer.scale, enable_gqa=True)
            output[g.tokens] = out.squeeze(2)
        for c in chunks:
            if c.seq_len == c.end - c.start:  # no history: this step's own K/V is the whole sequence
                k, v = key[c.start:c.end].transpose(0, 1)[None], value[c.start:c.end].transpose(0, 1)[None]
            else:
                row = attn_metadata.block_table[c.req_index]
                # 4-D inputs (a batch of one) take torch's fused CPU kernel; 3-D ones fall back to plain math
                k = gather_history(key_cache, row, c.seq_len).transpose(0, 1)[None]  # [1, num_kv_heads, L, head_size]
                v = gather_history(value_cache, row, c.seq_len).transpose(0, 1)[None]
            q = query[c.start:c.end].transpose(0, 1)[None]  # [1, num_heads, query_len, head_size]
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=c.mask, is_causal=c.mask is None,
                                                 scale=layer.scale, enable_gqa=True)
            output[c.start:c.end] = out[0].transpose(0, 1)
        return output
