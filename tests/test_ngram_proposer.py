"""The n-gram proposer (issue 44, item 4): the same drafts as the plain reading of its contract on thousands of
random sequences, at most 2 x len token comparisons whatever prompt_lookup_max is (counted, never timed), and
prompt_lookup_max unbounded as in vLLM."""
from __future__ import annotations

import random

import numpy as np
import pytest

from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.spec_decode.ngram_proposer import NgramProposer


def reference(tokens: list[int], min_n: int, max_n: int, k: int, max_model_len: int) -> list[int]:
    """The contract, plainly: n from the longest down; the earliest earlier copy of the suffix; what follows it."""
    total = len(tokens)
    room = min(k, max_model_len - total)
    if room <= 0:
        return []
    for n in range(min(max_n, total - 1), min_n - 1, -1):
        for j in range(total - n):  # an earlier copy ends at j + n - 1 <= total - 2
            if tokens[j:j + n] == tokens[total - n:]:
                return tokens[j + n:j + n + room]
    return []


def _random_cases(count: int, seed: int):
    rng = random.Random(seed)
    for _ in range(count):
        vocab, length = rng.choice([1, 2, 3, 5, 20]), rng.randrange(1, 90)
        min_n = rng.randrange(1, 8)
        max_n = rng.choice([min_n, min_n + rng.randrange(6), length, 10**6])
        yield ([rng.randrange(vocab) for _ in range(length)], min_n, max(max_n, min_n), rng.randrange(1, 10),
               length + rng.randrange(-2, 12))


def test_the_proposer_gives_the_references_drafts_on_random_sequences():
    matched = 0
    for tokens, min_n, max_n, k, max_model_len in _random_cases(6000, seed=44):
        expected = reference(tokens, min_n, max_n, k, max_model_len)
        got = NgramProposer(k, min_n, max_n, max_model_len).propose(np.array(tokens, dtype=np.int64))
        assert got == expected, (tokens, min_n, max_n, k, max_model_len)
        assert all(type(t) is int for t in got)
        matched += bool(expected)
    assert matched > 1500  # small vocabularies: most cases draft something, so the match rules are exercised


@pytest.mark.parametrize("tokens, min_n, max_n, k, expected", [  # vLLM's test_ngram.py cases
    ([1, 2, 3, 4, 1, 2, 3, 5, 6], 2, 2, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 2, 3, 4, 1, 2, 3], 1, 1, 2, [4, 1]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 2, 2, 3, [4, 1, 2]),
    ([1, 3, 6, 2, 3, 4, 1, 2, 3], 1, 1, 2, [6, 2]),  # the first occurrence
    ([1, 2, 3, 4, 1, 2, 3], 4, 4, 2, []),
    ([1, 2, 3, 4, 1, 2, 3], 3, 4, 2, [4, 1]),
    ([2, 3, 4, 5, 1, 2, 3, 4, 1, 2, 3, 4], 3, 4, 2, [1, 2]),  # the 4-gram, not the 3-gram's [5, 1]
    ([3, 4, 5, 2, 3, 4, 1, 2, 3, 4], 2, 4, 2, [1, 2]),
    ([1, 2, 3, 100, 1, 2, 3, 200, 1, 2, 3, 300, 1, 2, 3], 3, 3, 2, [100, 1]),
])
def test_vllms_cases(tokens, min_n, max_n, k, expected):
    assert NgramProposer(k, min_n, max_n, 1024).propose(np.array(tokens)) == expected


class CountedToken(int):
    """A token that counts every comparison made with it, in Python or in C (list.index, numpy object arrays)."""
    comparisons = 0

    def __eq__(self, other):
        CountedToken.comparisons += 1
        return int(self) == int(other)

    __hash__ = int.__hash__


def _fibonacci_word(length: int) -> list[int]:
    a, b = [0], [0, 1]
    while len(b) < length:
        a, b = b, b + a
    return b[:length]


ADVERSARIAL = {  # 200 tokens each: long matches, self-overlapping matches, and none at all
    "one token repeated": [7] * 200,
    "period 2": [1, 2] * 100,
    "period 7 but the last token": [1, 2, 3, 1, 2, 3, 4] * 28 + [1, 2, 3, 9],
    "fibonacci word": _fibonacci_word(200),
    "random over 2 tokens": [random.Random(1).randrange(2) for _ in range(200)],
    "the last token new": list(range(199)) + [500],
    "distinct, the last token recurring once": list(range(199)) + [3],
}


@pytest.mark.parametrize("name", sorted(ADVERSARIAL))
@pytest.mark.parametrize("min_n, max_n", [(1, 10**6), (1, 199), (3, 60), (1, 5)])
def test_the_proposer_makes_at_most_two_comparisons_per_token_whatever_prompt_lookup_max(name, min_n, max_n):
    """The issue's case: prompt_lookup_max 10**6 made the scan cubic in the context. Counted, not timed."""
    tokens = ADVERSARIAL[name]
    counted = np.array([CountedToken(t) for t in tokens], dtype=object)  # distinct objects: no identity shortcut
    CountedToken.comparisons = 0
    got = NgramProposer(4, min_n, max_n, 4096).propose(counted)
    assert got == reference(tokens, min_n, max_n, 4, 4096)
    assert 0 < CountedToken.comparisons <= 2 * len(tokens), CountedToken.comparisons


def test_prompt_lookup_max_has_no_upper_bound_as_vllm():
    """vLLM's SpeculativeConfig takes any prompt_lookup_max >= 1 (pydantic ge=1, min <= max): a huge one is
    harmless now, and drafts exactly as a value at the context's length does."""
    config = SpeculativeConfig.from_dict({"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 10**6,
                                          "prompt_lookup_min": 1})
    assert config.prompt_lookup_max == 10**6
    tokens = np.array(_fibonacci_word(300))
    huge = NgramProposer(4, 1, config.prompt_lookup_max, 2048).propose(tokens)
    assert huge == NgramProposer(4, 1, 299, 2048).propose(tokens) == reference(tokens.tolist(), 1, 299, 4, 2048)
    assert huge  # the Fibonacci word repeats itself: a long match is found
