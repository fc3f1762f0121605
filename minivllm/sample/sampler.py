"""Mirror of vllm/v1/sample/sampler.py: logits [num_logits, vocab_size] -> one token id per row.

Greedy rows take the argmax. Random rows apply temperature, min-p, top-k and
top-p, then draw with the exponential-race trick (argmax of probs / Exp(1)
noise), each row's noise coming from its request's own generator, so a seeded
request samples the same tokens whatever else shares the batch. Logprobs are
those of the raw model distribution. Rows short of min_tokens cannot draw EOS
or a stop id. Left out: penalties, bad words,
logit bias, allowed-token masks.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor  # [num_logits] float; rows with 0 are greedy
    all_greedy: bool
    top_k: torch.Tensor | None  # [num_logits] int, 0 = off; None if no row uses it
    top_p: torch.Tensor | None  # [num_logits] float, 1 = off
    min_p: torch.Tensor | None  # [num_logits] float, 0 = off
    generators: list[torch.Generator]  # one per row: the request's own, or the engine's
    max_num_logprobs: int | None  # None: no row asked for logprobs
    # (row, token ids) for rows still short of min_tokens: those ids (EOS, stop ids) get logit -inf
    min_tokens_masks: list[tuple[int, list[int]]] = field(default_factory=list)


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [num_logits]
    # (logprob of sampled, rank of sampled, top-k ids, top-k logprobs) when asked for
    logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None


class Sampler:
    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        raw = logits = logits.float()
        if md.min_tokens_masks:
            logits = apply_min_tokens(logits, md.min_tokens_masks)
        greedy = logits.argmax(dim=-1)  # [num_logits]
        sampled = greedy if md.all_greedy else self._sample(logits, md, greedy)
        # as vLLM's default logprobs_mode: logprobs of the raw model distribution, before any masking
        return SamplerOutput(sampled, self._logprobs(raw, sampled, md.max_num_logprobs))

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata, greedy: torch.Tensor) -> torch.Tensor:
        is_greedy = md.temperature == 0
        temperature = torch.where(is_greedy, torch.ones_like(md.temperature), md.temperature)
        logits = logits / temperature.unsqueeze(1)
        if md.min_p is not None:  # drop tokens below min_p x the top probability
            probs = logits.softmax(dim=-1)
            threshold = md.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        if md.top_k is not None or md.top_p is not None:
            logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
        probs = logits.softmax(dim=-1)
        noise = torch.stack([torch.empty(logits.shape[1], device=logits.device).exponential_(generator=g)
                             for g in md.generators])  # [num_logits, vocab_size]
        random = (probs / noise).argmax(dim=-1)
        return torch.where(is_greedy, greedy, random)

    @staticmethod
    def _logprobs(logits: torch.Tensor, sampled: torch.Tensor, k: int | None):
        if k is None:
            return None
        logprobs = logits.log_softmax(dim=-1)
        sampled_lp = logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1)
        rank = (logprobs > sampled_lp.unsqueeze(1)).sum(dim=-1) + 1
        top_lp, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], sampled[:, None][:, :0])
        return sampled_lp, rank, top_ids, top_lp


def apply_min_tokens(logits: torch.Tensor, masks: list[tuple[int, list[int]]]) -> torch.Tensor:
    """A copy of logits with each listed row's stop ids at -inf (vLLM's MinTokensLogitsProcessor)."""
    logits = logits.clone()
    rows = torch.tensor([row for row, ids in masks for _ in ids], dtype=torch.int64, device=logits.device)
    cols = torch.tensor([t for _, ids in masks for t in ids], dtype=torch.int64, device=logits.device)
    logits[rows, cols] = float("-inf")
    return logits


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask to -inf every token outside the top k and outside the smallest set with mass >= top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [num_logits, vocab_size]
    vocab = logits.shape[1]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
