"""Mirror of vllm/v1/sample/rejection_sampler.py: how many of a request's draft tokens the target model keeps.

A request with d drafts ran d + 1 positions in one forward: the target's distribution p_j at each draft
position j, and the bonus position after the last draft. Drafts are judged in order; the first rejected one
ends the run:
- greedy: draft j is kept while it equals argmax p_j; the first one that differs is replaced by that argmax;
- random: draft j is kept with probability p_j(draft_j) (the n-gram proposer has no draft distribution, so
  vLLM takes it as certain: q = 1 on the draft); a rejected draft is replaced by a token drawn from p_j with the
  draft's own probability removed and the rest renormalised. Then P(token x) = p_j(x) exactly: the draft with
  p(d) x 1, any other x with (1 - p(d)) x p(x) / (1 - p(d)).
If every draft is kept the bonus token (sampled from the bonus position by the ordinary Sampler) comes too, so
a request gains between 1 and d + 1 tokens per step. The target probabilities are those the Sampler would use
(temperature, min-p, top-k, top-p), so speculation never changes what is sampled, only how fast.
"""
from __future__ import annotations

import torch

from minivllm.sample.sampler import SamplingMetadata, Sampler


class RejectionSampler:
    def __call__(self, draft_token_ids: list[list[int]], target_logits: torch.Tensor,
                 bonus_token_ids: list[int], md: SamplingMetadata) -> list[list[int]]:
        """draft_token_ids[i]: request i's drafts (may be empty); target_logits [sum of drafts, vocab], request
        i's rows one per draft, in order; md: one row per draft row (each request's params repeated).
        Returns each request's output tokens: its kept drafts, then the replacement or the bonus token."""
        logits = target_logits.float()
        greedy = Sampler.greedy_sample(logits).tolist()  # [num_draft_rows]
        probs = None if md.all_greedy else Sampler.compute_probs(logits, md)  # [num_draft_rows, vocab]
        temperature = md.temperature.tolist()
        outputs, row = [], 0
        for drafts, bonus in zip(draft_token_ids, bonus_token_ids):
            kept: list[int] = []
            for j, draft in enumerate(drafts):
                r = row + j
                if temperature[r] == 0:
                    if greedy[r] != draft:
                        kept.append(greedy[r])
                        break
                else:
                    p = probs[r]
                    u = torch.rand(1, generator=md.generators[r], device=p.device).item()
                    if not u < p[draft].item():  # rejected: draw from p without the draft
                        residual = p.clone()
                        residual[draft] = 0
                        kept.append(Sampler.draw(residual.unsqueeze(0), [md.generators[r]])[0].item())
                        break
                kept.append(draft)
            else:
                kept.append(bonus)
            outputs.append(kept)
            row += len(drafts)
        return outputs
