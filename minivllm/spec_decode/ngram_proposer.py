"""Mirror of vllm/v1/spec_decode/ngram_proposer.py: draft tokens by prompt lookup, no draft model.

For each request the proposer looks for the longest n-gram (n from prompt_lookup_max down to prompt_lookup_min)
that ends the request's tokens and also occurs earlier in them; the tokens that followed its first earlier
occurrence are the drafts, up to k of them, fewer where the sequence ends first or max_model_len is near.
Input-grounded text (copying, editing, quoting a passage) repeats itself, so the drafts are often right.
Worked example, min 2, max 3, k 4: tokens [1, 2, 3, 4, 2, 3]: the suffix [4, 2, 3] occurs nowhere earlier,
[2, 3] occurs at index 1, so the drafts are what followed it: [4, 2, 3] (three tokens before the end).
vLLM finds the same match with a KMP pass under numba; this is a vectorised numpy scan, O(len x n) per n.
"""
from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 max_model_len: int) -> None:
        self.k, self.min_n, self.max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max
        self.max_model_len = max_model_len

    def propose(self, token_ids: np.ndarray) -> list[int]:
        """Drafts to follow `token_ids` (a request's prompt and outputs so far): [] when nothing matches."""
        total = len(token_ids)
        k = min(self.k, self.max_model_len - total)
        if k <= 0 or total <= self.min_n:
            return []
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            # windows[j] = token_ids[j:j + n] for every start whose n-gram ends before the last token
            windows = sliding_window_view(token_ids[:total - 1], n)
            hits = np.flatnonzero((windows == token_ids[total - n:]).all(axis=1))
            if len(hits):
                start = int(hits[0]) + n  # the first occurrence, as vLLM
                return token_ids[start:start + k].tolist()
        return []
