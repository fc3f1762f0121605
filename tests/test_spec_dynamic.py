"""Drafts shrink as the batch grows (issue 49: speculation never slower): the scheduler's
num_spec_tokens_to_schedule, its bound from MINIVLLM_SPEC_MAX_VERIFY_TOKENS, and the engine keeping to it."""
from __future__ import annotations

import pytest

from minivllm import LLM, SamplingParams, envs
from minivllm.spec_decode.config import num_spec_tokens_to_schedule

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 1}


@pytest.mark.parametrize("num_reqs, bound, expected", [
    (1, 16, 4),  # one request: k (16 rows would allow 15 drafts)
    (3, 16, 4),  # 3 x 5 = 15 rows fit
    (4, 16, 3),  # 4 x 4 = 16
    (5, 16, 2),  # 5 x 3 = 15
    (8, 16, 1),
    (9, 16, 0),  # 9 x 2 = 18 > 16: plain decode steps
    (64, 16, 0),
    (64, None, 4),  # no bound: vLLM's static k
    (0, 16, 4),  # nothing running: the first step after admission asks for nothing either way
])
def test_drafts_per_request_shrink_with_the_batch(num_reqs, bound, expected):
    assert num_spec_tokens_to_schedule(4, num_reqs, bound) == expected


def test_the_bound_defaults_by_device_and_is_read_strictly(monkeypatch):
    monkeypatch.delenv("MINIVLLM_SPEC_MAX_VERIFY_TOKENS", raising=False)
    assert envs.spec_max_verify_tokens("cpu") == envs.CPU_SPEC_MAX_VERIFY_TOKENS
    assert envs.spec_max_verify_tokens("cuda") is None
    for raw, want in (("0", None), ("00", None), ("none", None), ("NONE", None), ("40", 40)):
        monkeypatch.setenv("MINIVLLM_SPEC_MAX_VERIFY_TOKENS", raw)
        assert envs.spec_max_verify_tokens("cpu") == want
    monkeypatch.setenv("MINIVLLM_SPEC_MAX_VERIFY_TOKENS", "lots")
    with pytest.raises(ValueError, match="positive int"):
        envs.spec_max_verify_tokens("cpu")


PROMPTS = ["Repeat after me: the cat sat on the mat, the cat sat on the mat, the cat sat on",
           "1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2,", "a b c d a b c d a b", "x y x y x y x y x"]


def _most_drafts_at_eight(folder, bound, monkeypatch) -> tuple[list, int]:
    """(greedy tokens, the most drafts a request verified in a step that ran all eight requests)."""
    monkeypatch.setenv("MINIVLLM_SPEC_MAX_VERIFY_TOKENS", bound)
    llm = LLM(model=str(folder), multiprocess=False, seed=0, speculative_config=NGRAM)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    seen = [0]
    schedule = scheduler.schedule

    def watched():
        out = schedule()
        if len(out.num_scheduled_tokens) == 8:
            seen.extend(len(d) for d in out.scheduled_spec_decode_tokens.values())
        return out
    scheduler.schedule = watched
    outs = llm.generate(PROMPTS * 2, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    return [o.outputs[0].token_ids for o in outs], max(seen)


def test_the_engine_keeps_to_the_bound_and_the_tokens_do_not_change(smollm_folder, monkeypatch):
    """Eight repetitive requests: k drafts each without a bound, one with 16 rows, none with 8 (plain steps);
    as requests finish, the few left carry more. The tokens are the same every time."""
    unbounded, most = _most_drafts_at_eight(smollm_folder, "none", monkeypatch)
    assert most == 4
    bounded, most = _most_drafts_at_eight(smollm_folder, "16", monkeypatch)
    assert most == 1  # 8 x (1 + 1) = 16
    plain, most = _most_drafts_at_eight(smollm_folder, "8", monkeypatch)
    assert most == 0
    assert bounded == unbounded == plain
