"""Mirror of vllm/v1/attention/backends/cpu_attn.py: attention through the compiled CPU kernels, and only them.

The K/V write is C by slot_mapping (_C.reshape_and_cache, csrc/cpu/cache.c); the read is one C call per
layer for every query token of the step (_C.paged_attention, csrc/cpu/cpu_attn.c), which takes the step's
per-request metadata as it is (query_start_loc, seq_lens, block_table) and reads each request's history in
place through block_table, with no gather: prefill chunks in tiles of query rows (flash attention's online
softmax), decodes row by row. The backend is chosen only where the kernels serve the run
(minivllm/_custom_ops.py decides, once); a tensor they cannot take is a ValueError naming the fix, never a
silent detour through the PyTorch backend.
Left out: vLLM's ISA choice per step (AMX, VEC, VEC16; ours is fixed by the build), sliding windows, ALiBi,
soft-capping, sinks, fp8 caches, cascade attention.
"""
from __future__ import annotations

import torch

from minivllm import _C
from minivllm.attention.backends.utils import AttentionMetadata


class CPUAttentionImpl:
    def do_kv_cache_update(self, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor) -> None:
        """The write path, in C: token i's K/V lands in slot slot_mapping[i] (-1 is padding, skipped)."""
        _C.reshape_and_cache(key, value, kv_cache[0], kv_cache[1], slot_mapping)

    def forward(self, layer, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                attn_metadata: AttentionMetadata, output: torch.Tensor) -> torch.Tensor:
        """The read path, in C: request r's query rows query_start_loc[r] .. [r + 1] - 1 are the last of its
        seq_lens[r] positions, each seeing its history up to itself through block_table, in one call."""
        _C.paged_attention(output, query, kv_cache[0], kv_cache[1], attn_metadata.block_table,
                           attn_metadata.query_start_loc, attn_metadata.seq_lens, layer.scale)
        return output
