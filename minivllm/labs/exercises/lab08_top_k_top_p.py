"""Lab 8 (article part 6): top-k and top-p. Write apply_top_k_top_p (plain PyTorch).

Time: about 40 minutes.
"""
import torch


def apply_top_k_top_p(logits, top_k, top_p):
    """Return logits [num_logits, vocab_size] with -inf on every token outside each row's top k (k <= 0: no
    limit) and outside the smallest set of best tokens whose probability mass reaches top_p; either may be None.
    """
    ### BEGIN SOLUTION
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
    ### END SOLUTION
