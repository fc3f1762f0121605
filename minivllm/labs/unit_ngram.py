"""Unit checks of lab 10 (the n-gram proposer), without an engine: token sequences in, drafts out.

Hand-made cases first, each one rule of the contract at n-gram ranges 1-1 to 3-5 and k from 1 to 8; then 300
generated sequences (vocabularies of 2, 3, 5 and 20 tokens, so matches are frequent; 1 to 60 tokens, max_model_len
from one token short to ten tokens past the sequence), all compared with the engine's NgramProposer.propose. When
drafts differ, the judge replays the usual wrong readings of the contract on the case (plain Python, for the hint
only) and names the one the submission's drafts match.
"""
from __future__ import annotations

import random

import numpy as np

from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.spec_decode.ngram_proposer import NgramProposer

# (label, tokens, min_n, max_n, k, max_model_len)
MATCHES = [("the docstring's example", [1, 2, 3, 4, 2, 3], 2, 3, 4, 100),
           ("two earlier occurrences", [5, 1, 2, 9, 1, 2, 7, 1, 2], 2, 2, 3, 100),
           ("a longer n-gram beats a shorter one", [2, 3, 5, 1, 2, 3, 8, 1, 2, 3], 1, 3, 2, 100),
           ("only the shortest n matches", [7, 8, 9, 7], 1, 4, 3, 100),
           ("n from 3 to 5, k = 1", [4, 0, 4, 1, 2, 3, 4, 5, 6, 1, 2, 3, 4, 5, 7, 1, 2, 3, 4, 5], 3, 5, 1, 100),
           ("n = 1, k = 8", [9, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 9], 1, 1, 8, 100)]
LIMITS = [("k shorter than the continuation", [1, 2, 3, 4, 5, 6, 7, 1, 2], 2, 2, 3, 100),
          ("max_model_len two tokens away", [1, 2, 3, 4, 1, 2], 2, 2, 4, 8),
          ("max_model_len one token away", [1, 2, 3, 4, 1, 2], 1, 2, 4, 7),
          ("max_model_len reached", [1, 2, 3, 4, 1, 2], 1, 2, 4, 6),
          ("the sequence ends before k", [3, 3], 1, 1, 4, 100),
          ("no earlier occurrence", [1, 2, 3, 4, 5], 1, 3, 4, 100),
          ("no longer than min_n", [4, 4], 2, 3, 4, 100),
          ("a single token", [5], 1, 1, 4, 100)]


def _generated() -> list:
    rng, cases = random.Random(10), []
    for i in range(300):
        vocab, length = (2, 3, 5, 20)[i % 4], rng.randrange(1, 61)
        min_n = rng.randrange(1, 4)
        cases.append((f"generated case {i}", [rng.randrange(vocab) for _ in range(length)], min_n,
                      rng.randrange(min_n, 6), rng.randrange(1, 9), length + rng.randrange(-1, 11)))
    return cases


GENERATED = _generated()


def _observe(cases):
    @unit
    def observe(sub, llm, obs):
        obs["drafts"] = []
        for _, tokens, min_n, max_n, k, max_model_len in cases:
            got = sub["propose"](NgramProposer(k, min_n, max_n, max_model_len), np.array(tokens, dtype=np.int64))
            ok = isinstance(got, list) and all(isinstance(t, int) for t in got)
            obs["drafts"].append(got if ok else f"{type(got).__name__} {repr(got)[:60]}")
    return observe


def _replay(tokens, min_n, max_n, k, max_model_len, last=False, shortest=False, shift=0, cap=True, itself=False):
    """The contract read one wrong way (plain Python), for the hints only."""
    total = len(tokens)
    room = min(k, max_model_len - total) if cap else k
    longest = min(max_n, total - 1)
    for n in (range(min_n, longest + 1) if shortest else range(longest, min_n - 1, -1)):
        starts = [j for j in range(total - n + int(itself)) if tokens[j:j + n] == tokens[total - n:]]
        if starts and room > 0:
            follow = (starts[-1] if last else starts[0]) + n + shift
            return tokens[follow:follow + room]
    return []


_SLIPS = [(dict(itself=True), "the suffix itself is no earlier occurrence: an n-gram counts only if it ends before "
           "the last token (token_ids[:-1]), else it matches itself and nothing follows it"),
          (dict(last=True), "the earliest occurrence wins (the smallest start), not the latest"),
          (dict(shortest=True), "try the longest n first and stop at the first n that matches: a longer match is the "
           "better guess"),
          (dict(shift=-1), "the drafts start right after the matched n-gram (start + n), not at its last token"),
          (dict(shift=1), "the drafts start right after the matched n-gram (start + n), not one token later"),
          (dict(cap=False), "never propose past max_model_len: at most max_model_len - len(token_ids) drafts")]


def _judge(check: str, cases):
    def judge(obs, ref):
        for (label, tokens, min_n, max_n, k, max_model_len), exp, got in zip(cases, ref["drafts"], obs["drafts"]):
            if got == exp:
                continue
            where = f"{label}: tokens {tokens}, min_n {min_n}, max_n {max_n}, k {k}, max_model_len {max_model_len}"
            if isinstance(got, str):
                raise LabCheckFailed(check, where, f"a list of ints {exp}", got, "return a list of Python ints "
                                     "(.tolist() of a numpy slice), [] when nothing matches")
            hint = next((h for slip, h in _SLIPS if _replay(tokens, min_n, max_n, k, max_model_len, **slip) == got),
                        "n from min(max_n, len - 1) down to min_n; the earliest earlier n-gram equal to the suffix; "
                        "the tokens after it, at most k and at most max_model_len - len")
            if len(got) > k:
                hint = f"at most k = {k} drafts"
            raise LabCheckFailed(check, where, exp, got, hint)
    return judge


lab10_matches_observe, lab10_matches_judge = _observe(MATCHES), _judge("drafts: the longest n-gram, first match",
                                                                       MATCHES)
lab10_limits_observe, lab10_limits_judge = _observe(LIMITS), _judge("drafts: at most k, never past max_model_len",
                                                                    LIMITS)
lab10_generated_observe, lab10_generated_judge = _observe(GENERATED), _judge("generated sequences = reference",
                                                                             GENERATED)
