"""Lab 8 (article part 6): top-k and top-p. Write apply_top_k_top_p (plain PyTorch).

Time: about 40 minutes.
"""
import torch


def apply_top_k_top_p(logits, top_k, top_p):
    """Return logits [num_logits, vocab_size] with -inf on every token top-k or top-p rules out of its row.

    Inputs: logits, a float tensor [num_logits, vocab_size]; top_k, an int tensor [num_logits] or None (no top-k
    at all); top_p, a float tensor [num_logits] with values in (0, 1], or None (no top-p at all).
    Output: a tensor of the logits' shape; a token kept holds its logit unchanged, every other one is -inf.
    Rules, row by row:
      - top-k first: keep the tokens whose logit is at least the k-th best logit of the row (k = top_k[row];
        k <= 0 or k >= vocab_size: no limit);
      - then top-p, on what top-k kept, renormalised (softmax of the kept logits): sort the kept tokens best
        first and keep a token while the mass of the tokens strictly better than it is below top_p (the
        token that reaches top_p is kept).
    Invariants: every row keeps at least its best token; top_p = 1.0 removes nothing that top-k kept (bar
    probabilities that round to 0); a token tied with the k-th best logit is kept too; kept logits are not
    rescaled.
    Example: both rows [1.0, 2.0, 3.0, 4.0], top_k [2, 0], top_p [0.7, 0.7] -> [[-inf, -inf, -inf, 4.0],
    [-inf, -inf, 3.0, 4.0]]: row 0 keeps {3, 4}, renormalised to masses 0.73 and 0.27, so 4 alone reaches
    0.7; row 1 has no top-k, the masses are 0.64, 0.24, ... and 3.0 is needed to reach 0.7.
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


### BEGIN HIDDEN TESTS
def hidden_test_top_k_above_the_vocabulary():
    """top_k larger than the vocabulary keeps every token."""
    logits = torch.tensor([[0.5, -1.0, 2.0], [3.0, 1.0, 2.0]])
    got = apply_top_k_top_p(logits.clone(), torch.tensor([7, 3]), None)
    assert torch.equal(got, logits)


def hidden_test_top_p_one_keeps_all():
    """top_p = 1.0 keeps every token, alone or after top-k."""
    logits = torch.tensor([[0.1, 0.9, -0.4, 0.3], [2.0, 1.0, 0.0, -1.0]])
    assert torch.equal(apply_top_k_top_p(logits.clone(), None, torch.tensor([1.0, 1.0])), logits)
    got = apply_top_k_top_p(logits.clone(), torch.tensor([0, 2]), torch.tensor([1.0, 1.0]))
    inf = float("-inf")
    assert torch.equal(got, torch.tensor([[0.1, 0.9, -0.4, 0.3], [2.0, 1.0, inf, inf]]))


def hidden_test_ties_at_the_kth_logit():
    """Tokens tied with the k-th best logit are all kept."""
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0], [5.0, 4.0, 4.0, 4.0]])
    got = apply_top_k_top_p(logits.clone(), torch.tensor([1, 2]), None)
    inf = float("-inf")
    assert torch.equal(got, torch.tensor([[inf, 3.0, 3.0, inf], [5.0, 4.0, 4.0, 4.0]]))


def hidden_test_tiny_top_p_keeps_the_best():
    """A tiny top_p keeps exactly the best token of each row."""
    logits = torch.tensor([[0.0, 2.5, 1.0, -3.0], [9.0, -9.0, 8.9, 0.0]])
    got = apply_top_k_top_p(logits.clone(), torch.tensor([3, 0]), torch.tensor([1e-6, 0.01]))
    inf = float("-inf")
    assert torch.equal(got, torch.tensor([[inf, 2.5, inf, inf], [9.0, inf, inf, inf]]))
### END HIDDEN TESTS
