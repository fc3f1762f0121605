"""Mirror of vllm/v1/attention/backends/utils.py (CommonAttentionMetadata): one step's attention metadata.

Built once per step by the model runner and shared by every layer. Host-side
copies (`*_cpu`) let the PyTorch backend group requests without a device sync.
Left out: cascade attention, sliding windows, CUDA-graph padding.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class AttentionMetadata:
    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor  # [num_reqs + 1] int32, prefix sum of query lengths
    max_seq_len: int
    seq_lens: torch.Tensor  # [num_reqs] int32, history + this step's tokens
    block_table: torch.Tensor  # [num_reqs, max_num_blocks_per_req] int32, logical -> physical block
    slot_mapping: torch.Tensor  # [num_tokens] int64, where each new token's K/V is written
    query_start_loc_cpu: list[int]
    seq_lens_cpu: list[int]

    @property
    def num_reqs(self) -> int:
        return len(self.seq_lens_cpu)
