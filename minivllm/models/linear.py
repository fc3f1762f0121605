"""Mirror of vllm/model_executor/layers/linear.py: the linear layers, each holding only its rank's shard.

With tensor parallelism over `tp_size` ranks a weight W [output_size, input_size] is cut one of two ways:

- ColumnParallelLinear cuts the output dimension: rank r holds rows r*n/tp ... (r+1)*n/tp of W and
  computes its slice of the output, with no communication (each rank keeps its own heads or MLP units).
  MergedColumnParallelLinear is several of them fused in one matmul (gate and up); QKVParallelLinear
  fuses q, k and v and cuts by heads (a KV head is copied to several ranks when tp > num_kv_heads).
- RowParallelLinear cuts the input dimension: rank r multiplies its slice of the input by its columns of
  W, the partial outputs are summed over the ranks (`tensor_model_parallel_all_reduce`), and the bias is
  added once (by rank 0, before the sum).

So a Llama block costs two all-reduces per layer (after o_proj and after down_proj), as in Megatron-LM.
Every layer returns `(output, output_bias)` as vLLM's (output_bias is None: minivllm never defers the bias).
Each parameter has a `weight_loader(param, loaded_weight[, shard_id])` that takes the checkpoint's full
tensor and copies in this rank's slice, so every worker reads the same files and keeps a fraction.

How a shard multiplies its input is the layer's `quant_method` (UnquantizedLinearMethod, as vLLM's without a
quantization config); which GEMM runs it on the CPU is decided once at load, in models/utils.py. Left out:
quantization methods, gather_output, skip_bias_add, input_is_parallel=False, pipeline-parallel and LoRA variants.
"""
from __future__ import annotations

import torch
from torch import nn

from minivllm.distributed.communication_op import tensor_model_parallel_all_reduce
from minivllm.distributed.parallel_state import get_tp_group
from minivllm.models.utils import dispatch_cpu_unquantized_gemm, dispatch_unquantized_gemm


def divide(numerator: int, denominator: int) -> int:
    if numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by the tensor parallel size {denominator}")
    return numerator // denominator


class UnquantizedLinearMethod:
    """vLLM's linear method without quantization: the weight times the input, through the GEMM that
    models/utils.py picks for the layer (on the CPU, packed once after loading)."""

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        if layer.weight.device.type == "cpu":
            dispatch_cpu_unquantized_gemm(layer, remove_weight=True)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return dispatch_unquantized_gemm(layer)(layer, x, layer.weight, bias)


def default_weight_loader(param: nn.Parameter, loaded_weight: torch.Tensor) -> None:
    """Copy a replicated tensor whole (its shapes must agree)."""
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: model {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}")
    with torch.no_grad():
        param.copy_(loaded_weight)


class LinearBase(nn.Module):
    """weight [output_size_per_partition, input_size_per_partition]: this rank's shard only."""

    def __init__(self, input_size: int, output_size: int, bias: bool, *, input_size_per_partition: int,
                 output_size_per_partition: int, prefix: str = "") -> None:
        super().__init__()
        tp = get_tp_group()
        self.tp_rank, self.tp_size = tp.rank_in_group, tp.world_size
        self.input_size, self.output_size, self.prefix = input_size, output_size, prefix
        self.quant_method = UnquantizedLinearMethod()
        self.input_size_per_partition = input_size_per_partition
        self.output_size_per_partition = output_size_per_partition
        self.weight = nn.Parameter(torch.empty(output_size_per_partition, input_size_per_partition),
                                   requires_grad=False)
        self.weight.weight_loader = self.weight_loader
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(output_size_per_partition), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        raise NotImplementedError

    def local_bias(self) -> torch.Tensor | None:
        """The bias this rank adds in its own matmul."""
        return self.bias

    def matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x times this rank's shard, plus local_bias()."""
        return self.quant_method.apply(self, x, self.local_bias())

    def extra_repr(self) -> str:
        return (f"in_features={self.input_size_per_partition}, out_features={self.output_size_per_partition}, "
                f"bias={self.bias is not None}, tp_size={self.tp_size}")


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank (OPT's project_in / project_out)."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, prefix: str = "") -> None:
        super().__init__(input_size, output_size, bias, input_size_per_partition=input_size,
                         output_size_per_partition=output_size, prefix=prefix)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        default_weight_loader(param, loaded_weight)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.matmul(x), None


class ColumnParallelLinear(LinearBase):
    """Y = X W^T with W cut by output rows: rank r computes Y[:, r*n/tp:(r+1)*n/tp] and keeps it."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, prefix: str = "",
                 output_sizes: list[int] | None = None) -> None:
        tp_size = get_tp_group().world_size
        self.output_sizes = output_sizes or [output_size]
        super().__init__(input_size, output_size, bias, input_size_per_partition=input_size,
                         output_size_per_partition=divide(output_size, tp_size), prefix=prefix)

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        size = param.shape[0]
        default_weight_loader(param, loaded_weight.narrow(0, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        return self.matmul(x), None  # [num_tokens, output_size_per_partition]


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel weights in one matmul (Llama's gate_proj and up_proj): each is cut by rank,
    and rank r's slices sit side by side, [gate_r | up_r], so SiluAndMul pairs them on every rank."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True, prefix: str = "") -> None:
        super().__init__(input_size, sum(output_sizes), bias, prefix, output_sizes=list(output_sizes))

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: int | None = None) -> None:
        if shard_id is None:  # the fused tensor itself, already concatenated: load each part in turn
            for i, part in enumerate(loaded_weight.split(self.output_sizes, dim=0)):
                self.weight_loader(param, part, i)
            return
        offset = sum(self.output_sizes[:shard_id]) // self.tp_size
        size = self.output_sizes[shard_id] // self.tp_size
        default_weight_loader(param.data.narrow(0, offset, size), loaded_weight.narrow(0, self.tp_rank * size, size))


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v fused, cut by heads: rank r holds query heads r*h/tp ... and the KV heads they attend to.

    With fewer KV heads than ranks (tp > num_kv_heads) each rank holds one KV head, and each KV head is
    held by tp / num_kv_heads ranks (`num_kv_head_replicas`), as vLLM's.
    """

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int,
                 bias: bool = True, prefix: str = "") -> None:
        tp_size = get_tp_group().world_size
        self.head_size, self.total_num_heads, self.total_num_kv_heads = head_size, total_num_heads, total_num_kv_heads
        self.num_heads = divide(total_num_heads, tp_size)
        if tp_size >= total_num_kv_heads:
            self.num_kv_heads, self.num_kv_head_replicas = 1, divide(tp_size, total_num_kv_heads)
        else:
            self.num_kv_heads, self.num_kv_head_replicas = divide(total_num_kv_heads, tp_size), 1
        q, kv = total_num_heads * head_size, total_num_kv_heads * head_size
        output_size = (self.num_heads + 2 * self.num_kv_heads) * tp_size * head_size
        super().__init__(hidden_size, output_size, bias, prefix, output_sizes=[q, kv, kv])

    def _shard(self, shard_id: str) -> tuple[int, int, int]:
        """(offset in this rank's fused output, rows, the checkpoint row this rank's slice starts at)."""
        q_rows, kv_rows = self.num_heads * self.head_size, self.num_kv_heads * self.head_size
        if shard_id == "q":
            return 0, q_rows, self.tp_rank * q_rows
        offset = q_rows if shard_id == "k" else q_rows + kv_rows
        return offset, kv_rows, (self.tp_rank // self.num_kv_head_replicas) * kv_rows

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id: str | None = None) -> None:
        if shard_id is None:  # a checkpoint that stores qkv fused
            for sid, part in zip("qkv", loaded_weight.split(self.output_sizes, dim=0)):
                self.weight_loader(param, part, sid)
            return
        offset, rows, start = self._shard(shard_id)
        default_weight_loader(param.data.narrow(0, offset, rows), loaded_weight.narrow(0, start, rows))


class RowParallelLinear(LinearBase):
    """Y = X W^T with W cut by input columns: rank r multiplies its slice of X (the heads or MLP units it
    computed) by its columns; the partial results are summed over the ranks by an all-reduce."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, prefix: str = "",
                 reduce_results: bool = True) -> None:
        tp_size = get_tp_group().world_size
        self.reduce_results = reduce_results
        super().__init__(input_size, output_size, bias, input_size_per_partition=divide(input_size, tp_size),
                         output_size_per_partition=output_size, prefix=prefix)

    def local_bias(self) -> torch.Tensor | None:
        return self.bias if self.tp_rank == 0 else None  # added once, before the sum

    def weight_loader(self, param: nn.Parameter, loaded_weight: torch.Tensor, shard_id=None) -> None:
        if param.dim() == 1:  # the bias: whole on every rank
            return default_weight_loader(param, loaded_weight)
        size = param.shape[1]
        default_weight_loader(param, loaded_weight.narrow(1, self.tp_rank * size, size))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, None]:
        output = self.matmul(x)  # [num_tokens, output_size]: this rank's partial sum
        if self.reduce_results and self.tp_size > 1:
            output = tensor_model_parallel_all_reduce(output)
        return output, None
