"""Mirror of vllm/model_executor/custom_op.py: an op with a PyTorch formula and a compiled kernel, one dispatch.

Each CustomOp subclass writes `forward_native` (the PyTorch formula: the reference the tests compare
against, and the path on a GPU and in every dtype the kernels do not take) and `forward_cpu` (the
compiled C op of minivllm/_C.py). `forward` is the one place that picks: tensors on the CPU go to
forward_cpu, which hands back to forward_native whenever the compiled op cannot serve them (not
float32, a layout it does not take, no compiler, MINIVLLM_CPU_KERNELS=0). vLLM picks once per
platform at construction; minivllm checks per call, since dtype and layout decide here too.
"""
from __future__ import annotations

import torch
from torch import nn


class CustomOp(nn.Module):
    def forward(self, x: torch.Tensor, *args, **kwargs):
        if x.device.type == "cpu":
            return self.forward_cpu(x, *args, **kwargs)
        return self.forward_native(x, *args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)
