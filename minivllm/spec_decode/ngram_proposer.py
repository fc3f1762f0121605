"""Mirror of vllm/v1/spec_decode/ngram_proposer.py: draft tokens by prompt lookup, no draft model.

For each request the proposer looks for the longest n-gram (n from prompt_lookup_max down to prompt_lookup_min)
that ends the request's tokens and also occurs earlier in them; the tokens that followed its first earlier
occurrence are the drafts, up to k of them, fewer where the sequence ends first or max_model_len is near.
Input-grounded text (copying, editing, quoting a passage) repeats itself, so the drafts are often right.
Worked example, min 2, max 3, k 4: tokens [1, 2, 3, 4, 2, 3]: the suffix [4, 2, 3] occurs nowhere earlier,
[2, 3] occurs at index 1, so the drafts are what followed it: [4, 2, 3] (three tokens before the end).

How, as vLLM: one Knuth-Morris-Pratt pass over the reversed tokens. Reversed, the suffix becomes a prefix, and
an earlier occurrence of the last n tokens becomes a later place where the first n reversed tokens recur; the
prefix function (the longest prefix of the reversed tokens ending at each position, capped at
prompt_lookup_max) gives every such place in one pass, and the last position holding the longest length is the
earliest occurrence in the original order. At most 2 x len(tokens) token comparisons whatever prompt_lookup_max
is: each comparison either moves the scan forward or shortens the current match, which only grows as the scan
moves. vLLM compiles the pass with numba; here it runs in Python over a list, and where no match is open the scan
jumps to the next place the last token recurs with list.index (a C loop, the same comparisons). Unlike vLLM, the
prefix-function table holds min(prompt_lookup_max, len - 1) entries rather than prompt_lookup_max (no match is
longer than len - 1), so a huge prompt_lookup_max costs no memory either.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NgramProposer:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int,
                 max_model_len: int) -> None:
        self.k, self.min_n, self.max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max
        self.max_model_len = max_model_len

    def propose(self, token_ids: np.ndarray) -> list[int]:
        """Drafts to follow `token_ids` (a request's prompt and outputs so far): [] when nothing matches."""
        return _find_longest_matched_ngram_and_propose_tokens(token_ids.tolist(), self.min_n, self.max_n,
                                                              self.max_model_len, self.k)


def _find_longest_matched_ngram_and_propose_tokens(origin_tokens: Sequence[int], min_ngram: int, max_ngram: int,
                                                   max_model_len: int, k: int) -> list:
    """vLLM's function of this name, on a list: the tokens after the earliest earlier occurrence of the longest
    suffix n-gram, min_ngram <= n <= max_ngram; at most k, never past max_model_len; [] when none matches."""
    total = len(origin_tokens)
    k = min(k, max_model_len - total)
    if k <= 0 or total <= min_ngram:  # a match of n needs n + 1 tokens: the earlier copy ends before the last
        return []
    tokens = origin_tokens[::-1]  # the suffix is now the prefix tokens[:n]
    cap = min(max_ngram, total - 1)
    # lps[i], i < cap: the longest proper prefix of tokens[:i + 1] that also ends it (the prefix function)
    lps = [0] * cap
    first = tokens[0]
    longest = position = 0  # the longest match so far, and the last reversed position it ends at
    length, i = 0, 1  # tokens[:length] ends at tokens[i - 1]
    while i < total:
        if length == 0:  # nothing open: skip to where the last token recurs (tokens[0] compared at each step)
            try:
                i = tokens.index(first, i)
            except ValueError:
                break
            length = 1
        elif tokens[length] == tokens[i]:
            length += 1
        else:  # mismatch: fall back to the next shorter prefix that ends at i - 1
            length = lps[length - 1]
            continue
        # tokens[:length] ends at position i; reversed positions grow, so >= keeps the earliest original start
        if length >= longest:
            longest, position = length, i
        if i < cap:
            lps[i] = length
        if length == cap:  # never match longer than max_ngram: continue from its own longest border
            length = lps[cap - 1]
        i += 1
    if longest < min_ngram:
        return []
    # in the original order the match is origin_tokens[total - 1 - position:][:longest]; the drafts follow it
    start = total - 1 - position + longest
    return list(origin_tokens[start:start + k])
