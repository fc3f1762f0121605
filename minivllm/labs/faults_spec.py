"""The broken functions of labs 9, 10 and 11 (the rejection sampler, the n-gram proposer, the token budget): each a
mistake students make. faults.py names them and says which lab catches each.

Each lab's faults share one helper: the lab's reference exercise rewritten with a switch per mistake, every switch
off giving the reference itself (tests/test_labs_drift.py checks that), so each fault differs from the reference in
the one place its mistake is.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.sample.sampler import Sampler


# -- lab 9 ------------------------------------------------------------------------------------------------
def rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, *, breaks=True, always_bonus=False,
              row_gap=0, row_shift=0, residual=True, own_generator=True, argmax_only=False, draw_first=False):
    logits = target_logits.float()
    probs = Sampler.compute_probs(logits, md)
    outputs, first_row = [], 0
    for drafts, bonus in zip(draft_token_ids, bonus_token_ids):
        tokens, rejected = [], False
        for j, draft in enumerate(drafts):
            r = first_row + j + row_shift
            if draw_first:  # u drawn before the row's temperature is looked at: a greedy row draws one too
                u = torch.rand(1, generator=md.generators[r]).item()
            if argmax_only or md.temperature[r].item() == 0:
                token = int(logits[r].argmax())
                kept = token == draft
            else:
                generator = md.generators[r] if own_generator else None
                kept = (u if draw_first else torch.rand(1, generator=generator).item()) < probs[r, draft].item()
                if not kept:
                    p = probs[r].clone()
                    if residual:
                        p[draft] = 0
                    token = int(Sampler.draw(p.unsqueeze(0), [generator])[0])
            tokens.append(draft if kept else token)
            if not kept:
                rejected = True
                if breaks:
                    break
        if not rejected or always_bonus or not breaks:  # no break: the for loop's else clause always runs
            tokens.append(bonus)
        outputs.append(tokens)
        first_row += len(drafts) + row_gap
    return outputs


def reject_draw_for_greedy(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Draws u for every draft before looking at the temperature: greedy rows consume random numbers too."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, draw_first=True)


def reject_no_break(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Forgets the break: judges every draft, replacing each rejected one, and always appends the bonus."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, breaks=False)


def reject_always_bonus(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Appends the bonus token after the replacement of a rejected draft too."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, always_bonus=True)


def reject_row_off_by_one(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Counts a bonus row per request (as the runner's logits have): the next request's rows start one too late."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, row_gap=1)


def reject_previous_row(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Shifts the rows once more ("row t predicts token t + 1"): draft j is judged by the row before its own."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, row_shift=-1)


def reject_resample_from_p(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Replaces a rejected draft by a draw from p itself, not from the residual: the draft comes back too often."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, residual=False)


def reject_global_rng(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Draws from torch's global generator instead of the request's own: seeded requests are not reproducible."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, own_generator=False)


def reject_argmax_for_random(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Judges random rows like greedy ones: only an argmax draft is kept, and the replacement is the argmax."""
    return rejection(self, draft_token_ids, target_logits, bonus_token_ids, md, argmax_only=True)


# -- lab 10 -----------------------------------------------------------------------------------------------
def ngram(self, token_ids, *, last=False, shortest_first=False, shift=0, capped=True, itself=False):
    total = len(token_ids)
    room = min(self.k, self.max_model_len - total) if capped else self.k
    if room <= 0:
        return []
    lengths = range(min(self.max_n, total - 1), self.min_n - 1, -1)
    for n in (reversed(lengths) if shortest_first else lengths):
        source = token_ids if itself else token_ids[:total - 1]
        earlier = np.lib.stride_tricks.sliding_window_view(source, n)
        starts = np.flatnonzero((earlier == token_ids[total - n:]).all(axis=1))
        if starts.size:
            follow = int(starts[-1] if last else starts[0]) + n + shift
            return token_ids[follow:follow + room].tolist()
    return []


def ngram_last_occurrence(self, token_ids):
    """Takes the latest earlier occurrence of the suffix instead of the first."""
    return ngram(self, token_ids, last=True)


def ngram_shortest_first(self, token_ids):
    """Tries n from min_n up: the shortest match wins instead of the longest."""
    return ngram(self, token_ids, shortest_first=True)


def ngram_slice_off_by_one(self, token_ids):
    """Starts the drafts at the last token of the matched n-gram instead of right after it."""
    return ngram(self, token_ids, shift=-1)


def ngram_ignores_max_model_len(self, token_ids):
    """Always proposes up to k drafts, past max_model_len near the end of the request."""
    return ngram(self, token_ids, capped=False)


def ngram_self_match(self, token_ids):
    """Looks the suffix up in the whole sequence: it matches itself at the end, nothing follows, no draft."""
    return ngram(self, token_ids, itself=True)


# -- lab 11 -----------------------------------------------------------------------------------------------
def new_tokens(self, request, token_budget, num_computed_tokens=None, *, clamp=True, threshold_always=False,
               drafts=True, admit_whole=False, last_position=1, strict_fit=False):
    admitting = num_computed_tokens is not None
    start = num_computed_tokens if admitting else request.num_computed_tokens
    known = request.num_tokens if admitting or not drafts else request.num_tokens_with_spec
    wanted, cfg = known - start, self.scheduler_config
    if (cfg.enable_chunked_prefill or threshold_always) and cfg.long_prefill_token_threshold > 0:
        wanted = min(wanted, cfg.long_prefill_token_threshold)
    if admitting and not cfg.enable_chunked_prefill and (wanted >= token_budget if strict_fit else
                                                         wanted > token_budget):
        return wanted if admit_whole else 0
    return min(wanted, token_budget if clamp else wanted, self.max_model_len - last_position - start)


def new_tokens_no_budget_clamp(self, request, token_budget, num_computed_tokens=None):
    """Forgets the budget clamp: a request takes all it trails by, whatever is left of the step's budget."""
    return new_tokens(self, request, token_budget, num_computed_tokens, clamp=False)


def new_tokens_threshold_unchunked(self, request, token_budget, num_computed_tokens=None):
    """Applies long_prefill_token_threshold with chunked prefill off too: prompts cut although chunking is off."""
    return new_tokens(self, request, token_budget, num_computed_tokens, threshold_always=True)


def new_tokens_ignore_drafts(self, request, token_budget, num_computed_tokens=None):
    """Catches a running request up to num_tokens, not num_tokens_with_spec: its drafts are never scheduled."""
    return new_tokens(self, request, token_budget, num_computed_tokens, drafts=False)


def new_tokens_admit_overflow(self, request, token_budget, num_computed_tokens=None):
    """Without chunked prefill, admits a prompt whole although it does not fit: the step's budget is exceeded."""
    return new_tokens(self, request, token_budget, num_computed_tokens, admit_whole=True)


def new_tokens_strict_fit(self, request, token_budget, num_computed_tokens=None):
    """Without chunked prefill, admits a prompt only when it is shorter than the budget left: an exact fit waits."""
    return new_tokens(self, request, token_budget, num_computed_tokens, strict_fit=True)


def new_tokens_model_len_off_by_one(self, request, token_budget, num_computed_tokens=None):
    """Clamps at max_model_len - computed instead of max_model_len - 1 - computed: a draft at the last position."""
    return new_tokens(self, request, token_budget, num_computed_tokens, last_position=0)
