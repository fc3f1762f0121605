"""Lab 11 (the scheduler): the token budget of one step. Write Scheduler._num_new_tokens.

schedule() asks this function, for each RUNNING request and then for each WAITING one it tries to admit, how
many tokens the request gets this step; it subtracts them from the step's budget. The same rule covers a whole
prompt, a chunk of one, a decode, a decode with speculative drafts and a recompute after preemption: catch up
from what is computed to what is known, within the budget and the model's length. Time: about 30 minutes.
"""


def _num_new_tokens(self, request, token_budget, num_computed_tokens=None):
    """Return how many tokens `request` is scheduled this step (an int >= 0; 0: it gets nothing).

    Inputs: self, the Scheduler (self.scheduler_config: enable_chunked_prefill, long_prefill_token_threshold
    (0 = no threshold); self.max_model_len); request: num_tokens (prompt + outputs), num_tokens_with_spec
    (num_tokens + its drafts) and num_computed_tokens (tokens whose KV is in the cache); token_budget: what is
    left of this step's budget (>= 1); num_computed_tokens: None for a RUNNING request, and for a WAITING
    request being admitted the tokens its prefix-cache hit covers (its own num_computed_tokens is not set yet).
    Rules:
      - a running request catches up from request.num_computed_tokens to num_tokens_with_spec (drafts are
        tokens to compute too); a request being admitted from the given num_computed_tokens to num_tokens;
      - with chunked prefill on and a threshold set, at most long_prefill_token_threshold;
      - without chunked prefill, a request being admitted whose rest does not fit token_budget gets 0: it stays
        waiting and comes in whole later (a running request is clamped as usual);
      - never more than token_budget;
      - computed + new <= max_model_len - 1: position max_model_len - 1 holds a request's last possible
        token, which is sampled and never fed back, so no draft may sit there.
    Invariants: 0 <= result <= token_budget; computed + result <= max_model_len - 1; without chunked prefill an
    admission gets all of the rest or 0; the request itself is not changed (schedule() does that).
    Example (max_model_len 8192, chunked prefill on, no threshold): a running request of 20 tokens, 19
    computed, 3 drafts, budget 8 -> 4; budget 2 -> 2. Admitting a 55-token prompt with a hit of 48, budget 8
    -> 7; without chunked prefill and budget 5 -> 0.
    """
    ### BEGIN SOLUTION
    admitting = num_computed_tokens is not None
    start = num_computed_tokens if admitting else request.num_computed_tokens
    wanted = (request.num_tokens if admitting else request.num_tokens_with_spec) - start
    cfg = self.scheduler_config
    if cfg.enable_chunked_prefill and cfg.long_prefill_token_threshold > 0:
        wanted = min(wanted, cfg.long_prefill_token_threshold)
    if admitting and not cfg.enable_chunked_prefill and wanted > token_budget:
        return 0
    return min(wanted, token_budget, self.max_model_len - 1 - start)
    ### END SOLUTION
