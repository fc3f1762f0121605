"""Mirror of vllm/distributed/communication_op.py: the tensor-parallel collectives a layer calls by name."""
from __future__ import annotations

import torch

from minivllm.distributed.parallel_state import get_tp_group


def tensor_model_parallel_all_reduce(input_: torch.Tensor) -> torch.Tensor:
    """Sum over the tensor-parallel ranks (RowParallelLinear's partial outputs, VocabParallelEmbedding's rows)."""
    return get_tp_group().all_reduce(input_)


def tensor_model_parallel_all_gather(input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Every rank's slice, concatenated along `dim`, on every rank (the logits, in vLLM's V1 engine)."""
    return get_tp_group().all_gather(input_, dim)


def tensor_model_parallel_gather(input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
    """Every rank's slice, concatenated along `dim`, on rank `dst` only; None on the others."""
    return get_tp_group().gather(input_, dst, dim)
