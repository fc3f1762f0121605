"""Lab 9's exact random streams: a request's tokens are the engine's, not only distributed like them.

The distribution check (unit_spec.lab9_random_*) accepts any sampler whose tokens follow p. vLLM's promise is
stronger: a seeded request gets the same tokens as in any other run, and an unseeded one draws from the engine's
generator, which the unseeded requests share. Both hold only if the sampler draws exactly what the engine's does,
in its order: one uniform number per random draft judged, from md.generators[r], then on a rejection one
Sampler.draw with [md.generators[r]], and nothing at all for a greedy row. Two batches: seeded requests (each its
own generator; every fifth greedy), and unseeded ones (one shared generator) alternating greedy and random. Each
request's tokens must equal the engine's RejectionSampler's, exactly.
"""
from __future__ import annotations

import torch

from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.labs.unit_spec import _LISTS, _batch, _md, _plain
from minivllm.sample.rejection_sampler import RejectionSampler

CHECK = "random: the exact random stream of each request"


def _shared(sub, vocab: int = 6) -> list | str:
    """40 unseeded requests of 3 drafts on one shared generator (seed 7), even ones greedy, odd ones random."""
    g = torch.Generator().manual_seed(41)
    logits = torch.randn(40 * 3, vocab, generator=g)
    drafts = torch.randint(0, vocab, (40, 3), generator=g).tolist()
    shared = torch.Generator().manual_seed(7)
    md = _md([0.0 if i % 2 == 0 else 1.0 for i in range(40) for _ in range(3)], [shared] * 120)
    return _plain(sub["rejection_sample"](RejectionSampler(), drafts, logits, [100 + i for i in range(40)], md), 40)


@unit
def lab9_stream_observe(sub, llm, obs):
    obs["seeded"] = _batch(sub, list(range(40)))
    obs["shared"] = _shared(sub)


def lab9_stream_judge(obs, ref):
    for key, what, hint in (
            ("seeded", "(seeded: its own generator, every fifth request greedy)",
             "draw exactly what the engine draws, in its order: u = torch.rand(1, generator=md.generators[r]) for "
             "each random draft judged, then on a rejection Sampler.draw(residual.unsqueeze(0), [md.generators[r]]) "
             "(not torch.multinomial, not a second rand, not one u per request): a seeded request must get the "
             "tokens it gets in every other run"),
            ("shared", "(unseeded: the engine's generator, shared with the greedy requests beside it)",
             "a greedy row draws no random number: unseeded requests share the engine's generator, so a number "
             "drawn for a greedy row shifts every later unseeded request's tokens")):
        if not isinstance(obs[key], list):
            raise LabCheckFailed(CHECK, f"{key} batch: return value", "a list of 40 lists of ints", obs[key], _LISTS)
        for i, (exp, got) in enumerate(zip(ref[key], obs[key])):
            if exp != got:
                raise LabCheckFailed(CHECK, f"request {i} {what}", exp, got, hint)
