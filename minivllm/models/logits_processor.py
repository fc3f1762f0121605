"""Mirror of vllm/model_executor/layers/logits_processor.py: hidden states to full-vocabulary logits.

Each rank multiplies the selected hidden states by its ParallelLMHead shard, then the shards are joined.
vLLM's V1 engine joins them with an all-gather (its platforms' `use_all_gather()`), so every rank holds the
whole logits row and runs the same sampler with the same seeds: each rank then samples the same tokens and
keeps its own copy of every request's state, with no extra message to send them. minivllm does the same;
`tensor_model_parallel_gather` (the driver-only join vLLM keeps for other paths) is in communication_op.
The padding rows past the real vocabulary are cut off. Left out: logit scaling, soft capping, logits
processors over hidden states.
"""
from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.communication_op import tensor_model_parallel_all_gather
from minivllm.models.vocab_parallel_embedding import ParallelLMHead


class LogitsProcessor(nn.Module):
    def __init__(self, vocab_size: int) -> None:
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, lm_head: ParallelLMHead, hidden_states: torch.Tensor) -> torch.Tensor:
        logits = lm_head.quant_method.apply(lm_head, hidden_states)  # [num_logits, vocab / tp]: this rank's ids
        if lm_head.tp_size > 1:
            logits = tensor_model_parallel_all_gather(logits, dim=-1)  # [num_logits, padded vocab], every rank
        return logits[..., :self.vocab_size]
