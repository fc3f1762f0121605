"""Lab 9 (speculative decoding): the rejection sampler. Write what RejectionSampler.__call__ does.

With n-gram speculation a request brings d draft tokens into a step; the target model scores the real token and
the d drafts in one forward, and this function decides how many drafts survive. Greedy requests keep drafts while
they equal the target's argmax; random requests keep each with the target's probability of it. Either way a
request gains 1 to d + 1 tokens and samples exactly what plain decoding would. Time: about 40 minutes.
"""
import torch

from minivllm.sample.sampler import Sampler


def rejection_sample(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Return, for each request, the tokens it gains this step: its kept drafts, then one token of the target's.

    Inputs: self, the RejectionSampler (it holds nothing you need); draft_token_ids, one list of draft ids per
    request (possibly empty); target_logits [total number of drafts, vocab]: request i's rows follow request
    i - 1's, one per draft, row j being the target's logits for the position draft j sits at; bonus_token_ids,
    one id per request, already sampled at the position after its last draft; md, a SamplingMetadata with one
    row per row of target_logits: md.temperature[r] (0: greedy), md.generators[r] (the request's own
    torch.Generator) and what Sampler.compute_probs(logits, md) needs to give the target's probabilities p_r
    (temperature, top-k, top-p, min-p, as in an ordinary step).
    Output: a list of lists of int, one per request, each 1 to len(drafts) + 1 tokens long.
    Rules, draft by draft in order; the first rejected draft ends its request's list:
      - greedy row: the draft is kept if it equals the row's argmax; else that argmax is appended instead;
      - random row: with u = torch.rand(1, generator=md.generators[r]) (uniform in [0, 1)), the draft is kept
        if u < p_r[draft]; else a token drawn from p_r with the draft's own probability set to 0 (the
        residual; Sampler.draw renormalises it, with [md.generators[r]]) is appended instead;
      - draw nothing else, and nothing for a greedy row: unseeded requests share the engine's generator, and a
        request's tokens must be exactly the engine's (a seeded one's the same in every run);
      - all drafts kept: the bonus token is appended. A request with no drafts gets its bonus token alone.
    Invariants: a greedy request gets what plain greedy decoding gives; each token a random request gets
    follows p exactly (the draft d: kept with probability p(d); another x: rejected, then drawn, (1 - p(d)) *
    p(x) / (1 - p(d)) = p(x)); a seeded request's tokens depend on its own generator only, never on the other
    requests of the batch or their order.
    Example (all greedy): drafts [[4, 9, 6], [2, 3], []], the rows' argmaxes [4, 6, 1, 2, 3], bonus tokens
    [0, 8, 5] -> [[4, 6], [2, 3, 8], [5]]: 4 kept, 9 rejected for 6, and nothing after it (neither the draft
    6 nor the bonus 0); 2 and 3 kept, then the bonus 8; no drafts, the bonus 5 alone.
    """
    ### BEGIN SOLUTION
    logits = target_logits.float()
    probs = None if md.all_greedy else Sampler.compute_probs(logits, md)  # [rows, vocab]
    outputs, first_row = [], 0
    for drafts, bonus in zip(draft_token_ids, bonus_token_ids):
        tokens = []
        for j, draft in enumerate(drafts):
            r = first_row + j
            if md.temperature[r].item() == 0:
                best = int(logits[r].argmax())
                if best != draft:
                    tokens.append(best)
                    break
            else:
                u = torch.rand(1, generator=md.generators[r], device=logits.device).item()
                if u >= probs[r, draft].item():
                    residual = probs[r].clone()
                    residual[draft] = 0
                    tokens.append(int(Sampler.draw(residual.unsqueeze(0), [md.generators[r]])[0]))
                    break
            tokens.append(draft)
        else:
            tokens.append(bonus)
        outputs.append(tokens)
        first_row += len(drafts)
    return outputs
    ### END SOLUTION
