"""Mirror of vllm/model_executor/custom_op.py: an op with a PyTorch formula and a compiled kernel, picked once.

Each CustomOp subclass writes `forward_native` (the PyTorch formula: the reference the tests compare
against, and the path on a GPU and in every dtype the kernels do not take) and `forward_cpu` (the
compiled C op of minivllm/_C.py). `forward` runs the one chosen by minivllm/_custom_ops.py
(choose_custom_op_forward) on the op's first call and keeps it: forward_cpu on the CPU in float32 or
bfloat16 with the library built, forward_native otherwise (logged once). Where vLLM picks in
__init__ from the platform, minivllm picks at the first call, because a layer is built before the
model is moved to its device and dtype; moving or casting it (`.to()`) picks again.
Left out: vLLM's forward_cuda / forward_xpu / ... per platform, the op registry and the
`custom_ops` enable/disable list of the compilation config.
"""
from __future__ import annotations

import torch
from torch import nn

from minivllm import _custom_ops as ops


class CustomOp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.forward_method: str | None = None  # "forward_cpu" or "forward_native", chosen on the first call

    def forward(self, *args, **kwargs):
        if self.forward_method is None:  # from the call's first floating-point tensor: its device and dtype
            x = next(a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point())
            self.forward_method = ops.choose_custom_op_forward(x.device, x.dtype)
        return getattr(self, self.forward_method)(*args, **kwargs)

    def _apply(self, fn, *args, **kwargs):
        self.forward_method = None  # moved or cast (.to(), .float(), ...): choose again on the next call
        return super()._apply(fn, *args, **kwargs)

    def forward_native(self, *args, **kwargs):
        raise NotImplementedError

    def forward_cpu(self, *args, **kwargs):
        return self.forward_native(*args, **kwargs)
