"""Mirror of vllm/model_executor/layers/vocab_parallel_embedding.py: the vocabulary cut across the ranks.

The vocabulary is padded up to a multiple of the tensor-parallel size and cut into equal ranges; rank r
holds the embedding rows (and the lm_head rows) of token ids [vocab_start_index, vocab_end_index).

- VocabParallelEmbedding looks up only the ids in its range (the others give a zero row) and the ranks'
  rows are summed by an all-reduce, so every rank ends with every token's full embedding.
- ParallelLMHead is the same weight used as a matrix: rank r computes the logits of its own ids only;
  LogitsProcessor (minivllm/models/logits_processor.py) joins them into the full row.

Left out: vLLM's padding of the vocabulary to a multiple of 64, LoRA's added vocabulary, quantized heads.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.distributed.parallel_state import get_tp_group
from minivllm.models.linear import UnquantizedLinearMethod
from minivllm.utils.math_utils import cdiv


class VocabParallelEmbedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, prefix: str = "") -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank_in_group, tp.world_size
        self.org_vocab_size, self.embedding_dim, self.prefix = num_embeddings, embedding_dim, prefix
        self.num_embeddings_per_partition = cdiv(num_embeddings, self.tp_size)
        self.num_embeddings_padded = self.num_embeddings_per_partition * self.tp_size
        self.vocab_start_index = self.tp_rank * self.num_embeddings_per_partition
        self.vocab_end_index = min(self.vocab_start_index + self.num_embeddings_per_partition, num_embeddings)
        # padded rows (past the real vocabulary, on the last rank) stay zero
        self.weight = nn.Parameter(torch.zeros(self.num_embeddings_per_partition, embedding_dim), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        if loaded_weight.shape != (self.org_vocab_size, self.embedding_dim):
            raise ValueError(f"shape mismatch: model ({self.org_vocab_size}, {self.embedding_dim}), "
                             f"checkpoint {tuple(loaded_weight.shape)}")
        rows = self.vocab_end_index - self.vocab_start_index
        with torch.no_grad():
            param[:rows].copy_(loaded_weight.narrow(0, self.vocab_start_index, rows))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.tp_size == 1:
            return F.embedding(input_ids, self.weight)  # [num_tokens, embedding_dim]
        # ids outside this rank's range look up row 0, and their rows are zeroed before the sum
        outside = (input_ids < self.vocab_start_index) | (input_ids >= self.vocab_end_index)
        local_ids = (input_ids - self.vocab_start_index).masked_fill(outside, 0)
        output = F.embedding(local_ids, self.weight).masked_fill(outside.unsqueeze(-1), 0)
        output = tensor_model_parallel_all_reduce(output)
        return output

    def extra_repr(self) -> str:
        return (f"num_embeddings={self.num_embeddings_per_partition}, embedding_dim={self.embedding_dim}, "
                f"vocab_range=[{self.vocab_start_index}, {self.vocab_end_index}), tp_size={self.tp_size}")


class ParallelLMHead(VocabParallelEmbedding):
    """hidden_states @ W^T for this rank's vocabulary range only: [num_logits, num_embeddings_per_partition],
    through `quant_method.apply` (LogitsProcessor calls it). vLLM gives the head its UnquantizedEmbeddingMethod;
    the head is only ever a matmul here, so it has the linear one, which on the CPU drops the head's own
    reference to the unpacked weight once packed (a tied embedding keeps its own)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, prefix: str = "") -> None:
        super().__init__(num_embeddings, embedding_dim, prefix)
        self.quant_method = UnquantizedLinearMethod()

    def tie_weights(self, embed_tokens: VocabParallelEmbedding) -> "ParallelLMHead":
        """Share the input embedding's shard (tie_word_embeddings): the same rows, the same range."""
        self.weight = embed_tokens.weight
        return self

    def forward(self, input_):
        raise RuntimeError("ParallelLMHead is applied by LogitsProcessor (model.compute_logits), not called")
