"""Mirror of vllm/model_executor/layers/utils.py: which GEMM an unquantized linear layer's weight runs on.

vLLM's linear layers never pick a GEMM themselves: `UnquantizedLinearMethod.apply` (models/linear.py) calls
`dispatch_unquantized_gemm()(layer, x, layer.weight, bias)`. On the CPU, `process_weights_after_loading` has
called `dispatch_cpu_unquantized_gemm(layer, remove_weight=True)` once, at load: it packs the weight for the
CPU's GEMM libraries and sets `layer.cpu_linear(x, weight, bias)`, which `cpu_unquantized_gemm` calls. minivllm
does the same with two GEMMs, picked per call by the batch's rows:

- up to `small_batch_rows(dtype)` rows (every decode step), minivllm's compiled small-batch GEMM
  (csrc/cpu/gemm.c), which streams the weight from its own panel layout (_custom_ops.pack_small_batch_linear);
  bf16 takes it where the library has an AVX-512 tile (AVX512_BF16's dot products, or FMAs on weights widened
  in registers), and stays on oneDNN on a CPU without AVX-512;
- more rows (prefill), oneDNN on its own packed weight, the GEMM vLLM's CPU build runs (`ops.onednn_mm`).

The cost is a second copy of each weight; packing is a layout change only, so results agree with F.linear to
the dtype's rounding. Where we differ: vLLM picks by the platform; minivllm by the layer (one process may hold a
CPU and a GPU model), and keeps the packed tensors on the layer (`onednn_weight`, `gemm_panels`), not in a
closure, so that the loader can move the panels into one buffer and CPU graphs know them as kept memory.
benchmarks/decode_gemm.py times the two GEMMs side by side.
"""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from minivllm import _C, envs, platforms
from minivllm import _custom_ops as ops

# Rows up to which the C GEMM (gemm.c) runs a CPU linear; bigger batches go to oneDNN.
SMALL_BATCH = 512
# In bf16 on a CPU with AMX, oneDNN runs its GEMMs on the tile units, which the panel kernel's dot products
# cannot match once a GEMM is compute-bound: there the panels take only the batches bound by streaming the
# weights, about 16 rows for a model of this size (benchmarks/decode_gemm.py).
BF16_SMALL_BATCH = 16 if "amx_bf16" in platforms.cpu_flags() else SMALL_BATCH
# The batch size oneDNN's reorder packs a weight for.
ONEDNN_BATCH_SIZE_HINT = 4096


def small_batch_rows(dtype: torch.dtype) -> int:
    """The most rows a CPU linear runs on the C GEMM in `dtype` (more go to oneDNN)."""
    return SMALL_BATCH if dtype == torch.float32 else BF16_SMALL_BATCH


def cpu_packed_linear_available() -> bool:
    """oneDNN's packed linear is in this torch build, and MINIVLLM_CPU_PACKED_LINEAR does not turn it off."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and envs.cpu_packed_linear())


def dispatch_cpu_unquantized_gemm(layer: nn.Module, remove_weight: bool) -> None:
    """Once, after loading: set `layer.cpu_linear(x, weight, bias)`, the GEMM the layer runs on the CPU.

    A float32 or bf16 weight is packed for both GEMMs and, with `remove_weight`, the unpacked copy is dropped
    (an empty parameter of its dtype stays; a tied embedding keeps its own). Any other weight, or packing
    switched off, runs F.linear, vLLM's fallback.
    """
    weight = layer.weight.detach()
    if weight.dtype not in (torch.float32, torch.bfloat16) or not cpu_packed_linear_available():
        layer.cpu_linear = F.linear
        return
    out_features, in_features = weight.shape
    layer.onednn_weight = torch.ops.mkldnn._reorder_linear_weight(weight, ONEDNN_BATCH_SIZE_HINT)
    layer.gemm_panels = ops.pack_small_batch_linear(weight)  # None: every batch goes to oneDNN
    rows = -1 if layer.gemm_panels is None else small_batch_rows(weight.dtype)  # -1: even an empty batch to oneDNN

    def cpu_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if x.dim() != 2:  # the models hand over [num_tokens, hidden]: no reshape for them
            return cpu_linear(x.reshape(-1, in_features), weight, bias).view(*x.shape[:-1], out_features)
        if x.shape[0] <= rows:
            return _C.linear_small_batch(x, layer.gemm_panels, bias, out_features)
        return torch.ops.mkldnn._linear_pointwise(x, layer.onednn_weight, bias, "none", [], "")

    layer.cpu_linear = cpu_linear
    if remove_weight:
        layer.weight = nn.Parameter(torch.empty(0, dtype=weight.dtype), requires_grad=False)


def default_unquantized_gemm(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor,
                             bias: torch.Tensor | None = None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def cpu_unquantized_gemm(layer: nn.Module, x: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    return layer.cpu_linear(x, weight, bias)


def dispatch_unquantized_gemm(layer: nn.Module) -> Callable[..., torch.Tensor]:
    """The GEMM of `layer`: the CPU's once dispatch_cpu_unquantized_gemm has run on it, else F.linear."""
    return cpu_unquantized_gemm if "cpu_linear" in layer.__dict__ else default_unquantized_gemm
