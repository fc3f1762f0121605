"""Mirror of vllm/model_executor/layers/attention/attention.py: the Attention layer and its custom-op entry.

A model calls `Attention.forward(q, k, v)` with packed tensors; the layer does
not receive metadata. Two module-level functions stand in for vLLM's custom
ops: `unified_kv_cache_update` writes this step's K/V by slot_mapping and
returns a dummy tensor; `unified_attention_with_output` takes that tensor as
`kv_cache_dummy_dep`, so the write is ordered before the read in any graph,
then fetches metadata and the cache through `get_attention_context(layer_name)`.
Left out: torch.compile registration, quantized KV caches, encoder attention.
"""
from __future__ import annotations

import torch
from torch import nn

from minivllm.forward_context import get_forward_context


class Attention(nn.Module):
    def __init__(self, num_heads: int, head_size: int, scale: float, num_kv_heads: int, layer_name: str) -> None:
        super().__init__()
        self.num_heads, self.head_size, self.num_kv_heads = num_heads, head_size, num_kv_heads
        self.scale = scale
        self.layer_name = layer_name
        self.kv_cache = torch.empty(0)  # bound by the model runner: [2, num_blocks, block_size, num_kv_heads, head_size]
        self.impl = None  # bound by the model runner: the attention backend's implementation

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
        num_tokens = query.shape[0]
        query = query.view(num_tokens, self.num_heads, self.head_size)  # [num_tokens, num_heads, head_size]
        key = key.view(num_tokens, self.num_kv_heads, self.head_size)  # [num_tokens, num_kv_heads, head_size]
        value = value.view(num_tokens, self.num_kv_heads, self.head_size)
        output = torch.empty_like(query)
        dummy = unified_kv_cache_update(key, value, self.layer_name)
        unified_attention_with_output(query, key, value, output, self.layer_name, kv_cache_dummy_dep=dummy)
        return output.view(num_tokens, self.num_heads * self.head_size)


def get_attention_context(layer_name: str):
    """What one layer pulls from the forward context: (attn_metadata, layer, kv_cache, slot_mapping)."""
    forward_context = get_forward_context()
    attn_layer = forward_context.no_compile_layers[layer_name]
    slot_mapping = forward_context.slot_mapping.get(layer_name)
    return forward_context.attn_metadata, attn_layer, attn_layer.kv_cache, slot_mapping


def unified_kv_cache_update(key: torch.Tensor, value: torch.Tensor, layer_name: str) -> torch.Tensor:
    attn_metadata, layer, kv_cache, slot_mapping = get_attention_context(layer_name)
    layer.impl.do_kv_cache_update(key, value, kv_cache, slot_mapping)
    return torch.empty(0, device=key.device)  # the dummy dependency handed to the read


def unified_attention_with_output(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, output: torch.Tensor,
                                  layer_name: str, kv_cache_dummy_dep: torch.Tensor | None = None) -> None:
    # kv_cache_dummy_dep is unused on purpose: taking it makes the cache write an input of this read.
    attn_metadata, layer, kv_cache, _ = get_attention_context(layer_name)
    layer.impl.forward(layer, query, key, value, kv_cache, attn_metadata, output=output)
