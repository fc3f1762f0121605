"""SpecDecodingStats as vLLM's (vllm/v1/spec_decode/metrics.py, tests/v1/spec_decode/test_metrics.py): issue 44,
item 9, more accepted tokens than a draft may hold is vLLM's AssertionError, not an IndexError."""
from __future__ import annotations

import pytest

from minivllm.spec_decode.metrics import SpecDecodingStats


def test_more_accepted_tokens_than_spec_tokens_is_vllms_assertion():
    stats = SpecDecodingStats.new(num_spec_tokens=2)
    with pytest.raises(AssertionError, match="3 tokens accepted from a draft of at most 2"):
        stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=3)


def test_the_scheduler_s_constructor_asserts_the_same():
    stats = SpecDecodingStats(4)  # as Scheduler builds it
    with pytest.raises(AssertionError):
        stats.observe_draft(num_draft_tokens=4, num_accepted_tokens=5)


def test_new_starts_zeroed_and_independent():
    a, b = SpecDecodingStats.new(num_spec_tokens=3), SpecDecodingStats.new(num_spec_tokens=3)
    assert (a.num_drafts, a.num_draft_tokens, a.num_accepted_tokens) == (0, 0, 0)
    assert a.num_accepted_tokens_per_pos == a.num_draft_tokens_per_pos == [0, 0, 0]
    a.observe_draft(num_draft_tokens=3, num_accepted_tokens=2)
    assert b.num_accepted_tokens_per_pos == b.num_draft_tokens_per_pos == [0, 0, 0]
    assert SpecDecodingStats(3) == SpecDecodingStats.new(3)


def test_counters_accumulate_per_position():
    stats = SpecDecodingStats.new(num_spec_tokens=3)
    stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=3)
    stats.observe_draft(num_draft_tokens=3, num_accepted_tokens=1)
    stats.observe_draft(num_draft_tokens=2, num_accepted_tokens=0)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (3, 8, 4)
    assert stats.num_accepted_tokens_per_pos == [2, 1, 1]
    assert stats.num_draft_tokens_per_pos == [3, 3, 2]  # the third draft was two tokens long
    assert stats.acceptance_rate == 4 / 8 and stats.mean_acceptance_length == 1 + 4 / 3


def test_every_spec_token_accepted_is_no_error():
    stats = SpecDecodingStats.new(num_spec_tokens=2)
    stats.observe_draft(num_draft_tokens=2, num_accepted_tokens=2)
    assert stats.num_accepted_tokens_per_pos == [1, 1]
