"""Mirror of vllm/attention/selector.py: the attention backend of a run, and its implementation.

`get_attn_backend_name` asks minivllm/_custom_ops.py, the one place that decides which implementation
runs (the `attention_backend` engine argument, then MINIVLLM_ATTENTION_BACKEND, then the device's
default); `get_attn_impl` builds that backend's implementation once per engine and logs which KV
write and paged read it runs. A backend's write and read never change per call.
Left out: vLLM's AttentionBackend classes and their registry, per-layer backends, head-size and
block-size checks per backend, MLA and encoder attention.
"""
from __future__ import annotations

import torch

from minivllm import _custom_ops as ops

BACKENDS = tuple(ops.ATTENTION_BACKENDS)  # ("cpu", "torch", "triton")


def get_attn_backend_name(requested: str | None, device: str, dtype: torch.dtype | str | None = None) -> str:
    """The backend's name; with the model's dtype the CPU default follows it (float16 -> "torch")."""
    return ops.choose_attention_backend(requested, device, dtype)


def get_attn_impl(name: str):
    """The backend's implementation, shared by every attention layer: do_kv_cache_update writes, forward reads."""
    if name == "triton":
        from minivllm.attention.backends.triton_attn import TritonAttentionImpl as impl_cls
    elif name == "cpu":
        from minivllm.attention.backends.cpu_attn import CPUAttentionImpl as impl_cls
    elif name == "torch":
        from minivllm.attention.backends.torch_attn import TorchAttentionImpl as impl_cls
    else:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {name!r}")
    ops.log_attention_ops(name)
    return impl_cls()
