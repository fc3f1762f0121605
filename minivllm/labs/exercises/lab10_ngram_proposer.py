"""Lab 10 (speculative decoding): prompt lookup. Write what NgramProposer.propose does.

The n-gram proposer guesses a request's next tokens without a draft model: if the last few tokens occurred
before, what followed them then is a good guess now (code, quotes, lists and edits repeat themselves). The target
model verifies the guesses (lab 9), so a bad guess costs time, never a wrong token. Plain numpy. Time: about
30 minutes.
"""
import numpy as np


def propose(self, token_ids):
    """Return the drafts to follow token_ids (a request's prompt and outputs so far): a list of at most k ints.

    Inputs: self, the NgramProposer (self.k: the most drafts; self.min_n and self.max_n: the shortest and longest
    n-gram looked up; self.max_model_len); token_ids, a 1-D int64 numpy array, at least one token long.
    Output: a list of Python ints, [] when nothing matches.
    Rules:
      - n goes from the longest possible, min(self.max_n, len(token_ids) - 1), down to self.min_n; the first n
        with a match decides (a longer match is the better guess);
      - a match of n is an earlier n-gram equal to the suffix token_ids[-n:]: token_ids[j:j + n] with
        j + n <= len(token_ids) - 1, so the suffix itself never counts; the earliest (smallest j) wins;
      - the drafts are the tokens right after that n-gram, token_ids[j + n:], at most self.k of them (fewer
        when the sequence ends first);
      - a request never grows past max_model_len: at most max_model_len - len(token_ids) drafts (none at all
        when that is 0 or less).
    Invariants: the drafts are a slice of token_ids that starts right after an earlier copy of the suffix; the
    result depends on token_ids and the proposer's four numbers only (nothing kept between calls).
    Example: min_n 2, max_n 3, k 4, tokens [1, 2, 3, 4, 2, 3]: the suffix [4, 2, 3] occurs nowhere earlier, the
    suffix [2, 3] occurs at j = 1, so the drafts are [4, 2, 3] (three tokens follow it before the end); with
    max_model_len 8 they would be [4, 2].
    """
    ### BEGIN SOLUTION
    total = len(token_ids)
    room = min(self.k, self.max_model_len - total)
    if room <= 0:
        return []
    for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
        earlier = np.lib.stride_tricks.sliding_window_view(token_ids[:total - 1], n)  # every n-gram before the end
        starts = np.flatnonzero((earlier == token_ids[total - n:]).all(axis=1))
        if starts.size:
            follow = int(starts[0]) + n
            return token_ids[follow:follow + room].tolist()
    return []
    ### END SOLUTION
