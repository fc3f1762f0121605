"""Mirror of vllm/v1/worker/gpu_input_batch.py and gpu/input_batch.py: per-request rows and one step's packed batch.

`InputBatch` is the persistent part: each live request owns a row of
`token_ids_cpu` (every token it has) and of `block_table_cpu` (its physical
blocks), written once and updated by deltas. `PackedBatch` is what
`_prepare_inputs` builds from those rows for one step: every array is laid on
one token dimension. Left out: spec-decode tokens, LoRA, pooling, the
condense/swap of rows that vLLM does to keep rows contiguous (we index rows).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from minivllm.spec_decode.metadata import SpecDecodeMetadata


class InputBatch:
    def __init__(self, max_num_reqs: int, max_model_len: int, max_num_blocks_per_req: int) -> None:
        self.token_ids_cpu = np.zeros((max_num_reqs, max_model_len), dtype=np.int64)  # [rows, max_model_len]
        self.num_tokens_cpu = np.zeros(max_num_reqs, dtype=np.int64)  # [rows]
        self.block_table_cpu = np.zeros((max_num_reqs, max_num_blocks_per_req), dtype=np.int32)  # [rows, max_blocks]
        self.num_blocks_cpu = np.zeros(max_num_reqs, dtype=np.int64)  # [rows]
        self.req_id_to_row: dict[str, int] = {}
        self._free_rows = list(range(max_num_reqs - 1, -1, -1))

    def add_request(self, req_id: str, token_ids: list[int], block_ids: list[int]) -> int:
        row = self._free_rows.pop()
        self.req_id_to_row[req_id] = row
        self.token_ids_cpu[row, :len(token_ids)] = token_ids
        self.num_tokens_cpu[row] = len(token_ids)
        self.num_blocks_cpu[row] = 0
        self.append_block_ids(req_id, block_ids)
        return row

    def remove_request(self, req_id: str) -> None:
        row = self.req_id_to_row.pop(req_id, None)
        if row is not None:
            self._free_rows.append(row)

    def append_block_ids(self, req_id: str, block_ids: list[int]) -> None:
        row = self.req_id_to_row[req_id]
        start = self.num_blocks_cpu[row]
        self.block_table_cpu[row, start:start + len(block_ids)] = block_ids
        self.num_blocks_cpu[row] = start + len(block_ids)

    def append_token(self, req_id: str, token_id: int) -> None:
        row = self.req_id_to_row[req_id]
        self.token_ids_cpu[row, self.num_tokens_cpu[row]] = token_id
        self.num_tokens_cpu[row] += 1


@dataclass
class PackedBatch:
    """One step's model input, flattened: the article's InputBatch fields."""

    req_ids: list[str]
    num_reqs: int
    num_scheduled_tokens: np.ndarray  # [num_reqs] tokens each request runs this step
    num_tokens: int  # sum(num_scheduled_tokens)
    query_start_loc: torch.Tensor  # [num_reqs + 1] prefix sum: request i owns rows [qsl[i], qsl[i+1])
    seq_lens: torch.Tensor  # [num_reqs] history + this step's tokens
    input_ids: torch.Tensor  # [num_tokens]
    positions: torch.Tensor  # [num_tokens] each token's position in its own request
    slot_mapping: torch.Tensor  # [num_tokens] block_table[pos // block_size] * block_size + pos % block_size
    block_table: torch.Tensor  # [num_reqs, max_num_blocks] logical -> physical block
    # [num_logits] last row of each request that samples this step; with drafts (speculative decoding) a
    # request's last d + 1 rows, as spec_decode_metadata.logits_indices (vLLM's _prepare_inputs does the same)
    logits_indices: torch.Tensor
    sampling_req_indices: list[int]  # which requests those logits belong to
    num_computed_tokens: np.ndarray | None = None  # [num_reqs] tokens already in the KV cache before this step
    spec_decode_metadata: SpecDecodeMetadata | None = None  # None: no request carries drafts this step
