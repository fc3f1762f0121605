"""The model runner's sampling step (vLLM's GPUModelRunner._sample and propose_draft_token_ids), apart so the
runner stays readable: logits in, each sampling request's new tokens (and their logprobs) out.

Without drafts: one row per request through the Sampler, one token each. With drafts (speculative decoding):
the Sampler draws each request's bonus token from its last row, the RejectionSampler judges the drafts
against the rows before it, and a request gets its kept drafts plus the replacement or the bonus. Logprobs
(raw, as vLLM's default) are then those of each returned token at the row that produced it.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.sample.sampler import Sampler
from minivllm.spec_decode.metadata import SpecDecodeMetadata
from minivllm.spec_decode.ngram_proposer import NgramProposer
from minivllm.worker.input_batch import InputBatch
from minivllm.worker.sampling_state import SamplingState

Logprobs = list[tuple[float, int, list[tuple[int, float]]]]


def sample_tokens(sampler: Sampler, rejection_sampler: RejectionSampler, state: SamplingState, batch: InputBatch,
                  logits: torch.Tensor, req_ids: list[str],
                  spec: SpecDecodeMetadata | None) -> tuple[list[list[int]], list[Logprobs | None] | None]:
    """logits: [len(req_ids), vocab] without drafts, else [spec.logits_indices] rows. Returns per request the
    new tokens and, where asked for, their logprobs."""
    bonus_logits = logits if spec is None else logits[torch.from_numpy(spec.bonus_logits_indices).to(logits.device)]
    md = state.make_sampling_metadata(req_ids, batch)
    sampled = sampler(bonus_logits, md)
    tokens = sampled.sampled_token_ids.tolist()
    if spec is None:
        outputs, raw_logprobs = [[t] for t in tokens], sampled.logprobs
    else:
        rows = [r for r, drafts in zip(req_ids, spec.draft_token_ids) for _ in drafts]
        target = logits[torch.from_numpy(spec.target_logits_indices).to(logits.device)]
        outputs = rejection_sampler(spec.draft_token_ids, target, tokens, state.make_sampling_metadata(rows, batch))
        raw_logprobs = None
        if sampled.logprobs is not None:  # each returned token at the row that produced it
            at = np.concatenate([start + np.arange(len(out)) for start, out in zip(spec.group_starts, outputs)])
            flat = torch.tensor([t for out in outputs for t in out], dtype=torch.int64, device=logits.device)
            raw_logprobs = Sampler._logprobs(logits[torch.from_numpy(at).to(logits.device)].float(), flat, md.max_num_logprobs)
    if raw_logprobs is None:
        return outputs, None
    lp, rank, top_ids, top_lp = (t.tolist() for t in raw_logprobs)
    logprobs, j = [], 0
    for req_id, out in zip(req_ids, outputs):
        k = state.requests[req_id].logprobs
        k = state.vocab_size if k == -1 else k
        logprobs.append(None if k is None else [(lp[j + i], rank[j + i], list(zip(top_ids[j + i][:k], top_lp[j + i][:k])))
                                                for i in range(len(out))])
        j += len(out)
    return outputs, logprobs


def propose_draft_token_ids(proposer: NgramProposer, state: SamplingState, batch: InputBatch,
                            req_ids: list[str], max_drafts: int) -> dict[str, list[int]]:
    """Drafts for each request's next step from its own tokens, at most max_drafts each (the scheduler's
    num_spec_tokens_to_schedule: 0 proposes nothing). None for a request whose logits the sampler
    processes with its history (penalties, bias, whitelist, bad words) or that is still short of min_tokens:
    its draft rows would need that processing position by position (vLLM does it; not built here)."""
    drafts = {}
    if max_drafts == 0:
        return drafts
    for req_id in req_ids:
        params, row = state.requests[req_id], batch.req_id_to_row[req_id]
        num_tokens = int(batch.num_tokens_cpu[row])
        if params.uses_logits_processing or num_tokens - state.num_prompt_tokens[req_id] < params.min_tokens:
            continue
        drafts[req_id] = proposer.propose(batch.token_ids_cpu[row, :num_tokens])[:max_drafts]
    return drafts
