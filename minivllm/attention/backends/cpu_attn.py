"""Mirror of vllm/v1/attention/backends/cpu_attn.py: attention through the compiled CPU kernels, and only them.

The K/V write is C by slot_mapping (_C.reshape_and_cache, csrc/cpu/cache.c); the read is one C call per
layer for every query token of the step (_C.paged_attention, csrc/cpu/cpu_attn.c), which reads each
request's history in place through block_table, with no gather. The backend is chosen only where the
kernels serve the run (minivllm/_custom_ops.py decides, once); a tensor they cannot take is a ValueError
naming the fix, never a silent detour through the PyTorch backend.
Left out: vLLM's ISA choice per step (AMX, VEC, VEC16; ours is fixed by the build), sliding windows, ALiBi,
soft-capping, sinks, fp8 caches, cascade attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from minivllm import _C
from minivllm.attention.backends.utils import AttentionMetadata


@dataclass
class QueryPlan:
    """The compiled kernel's view of a step: every query token, its request, and how many keys it sees."""
    token_index: torch.Tensor  # [num_tokens] packed row of each query token
    req_index: torch.Tensor  # [num_tokens] its request's row in block_table
    kv_lens: torch.Tensor  # [num_tokens] position + 1: causal, this step's own earlier tokens included
    max_kv_len: int


def plan_queries(md: AttentionMetadata) -> QueryPlan:
    """Token j of a request with query_len q and seq_len s sits at position s - q + j and sees s - q + j + 1 keys.

    query_start_loc [0, 3, 4], seq_lens [3, 9] -> req_index [0, 0, 0, 1], kv_lens [1, 2, 3, 9]
    """
    num_tokens, device = md.num_actual_tokens, md.seq_lens.device
    qsl = md.query_start_loc.long()
    query_lens = qsl[1:] - qsl[:-1]  # [num_reqs]
    req_index = torch.repeat_interleave(torch.arange(md.num_reqs, device=device), query_lens)  # [num_tokens]
    offsets = torch.arange(num_tokens, device=device) - qsl[:-1][req_index]  # [num_tokens] j within the request
    kv_lens = (md.seq_lens.long() - query_lens)[req_index] + offsets + 1  # [num_tokens]
    return QueryPlan(torch.arange(num_tokens, device=device), req_index, kv_lens.to(torch.int32), md.max_seq_len)


class CPUAttentionImpl:
    def __init__(self) -> None:
        self._query_plan: tuple[AttentionMetadata, QueryPlan] | None = None

    def do_kv_cache_update(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """The write path, in C: token i's K/V lands in slot slot_mapping[i] (-1 is padding, skipped)."""
        _C.reshape_and_cache(key, value, kv_cache[0], kv_cache[1], slot_mapping)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        """The read path, in C: every query token reads its history through block_table, in one call."""
        if self._query_plan is None or self._query_plan[0] is not attn_metadata:  # once per step
            self._query_plan = (attn_metadata, plan_queries(attn_metadata))
        p = self._query_plan[1]
        _C.paged_attention(output, query, kv_cache[0], kv_cache[1], attn_metadata.block_table, p.token_index,
                           p.req_index, p.kv_lens, p.max_kv_len, layer.scale)
        return output
