"""Mirror of vllm/v1/spec_decode/metadata.py: which rows of a step's hidden states go through lm_head.

Without drafts each sampling request sends one row, its last. A request verifying d drafts sends its last
d + 1 rows: the row of its last real token predicts where draft 0 should be, the row of draft j where draft
j + 1 should be, the row of the last draft the bonus token. Worked example: requests A (2 drafts) and B (none)
with query_start_loc [0, 3, 4]: logits_indices [0, 1, 2, 3]; target rows (draft positions) [0, 1] of those
logits, bonus rows [2, 3].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SpecDecodeMetadata:
    draft_token_ids: list[list[int]]  # per sampling request (possibly empty)
    logits_indices: np.ndarray  # [sum(d + 1)] packed rows to project, each request's d + 1 in order
    target_logits_indices: np.ndarray  # [sum(d)] which of those logits judge a draft
    bonus_logits_indices: np.ndarray  # [num_sampling_reqs] which of those logits give the bonus token
    group_starts: np.ndarray  # [num_sampling_reqs] each request's first row among the logits


def make_spec_decode_metadata(query_ends: np.ndarray, draft_token_ids: list[list[int]]) -> SpecDecodeMetadata:
    """query_ends[i]: one past sampling request i's last packed row (query_start_loc[req + 1])."""
    num_drafts = np.array([len(d) for d in draft_token_ids], dtype=np.int64)
    num_rows = num_drafts + 1
    group_starts = np.concatenate(([0], np.cumsum(num_rows)[:-1]))  # [num_sampling_reqs]
    # each request's rows query_end - d - 1 .. query_end - 1
    offsets = np.arange(num_rows.sum()) - np.repeat(group_starts, num_rows)
    logits_indices = np.repeat(query_ends - num_rows, num_rows) + offsets
    bonus = group_starts + num_drafts
    target = np.delete(np.arange(num_rows.sum()), bonus)
    return SpecDecodeMetadata(draft_token_ids, logits_indices, target, bonus, group_starts)
