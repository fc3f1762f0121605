"""Mirror of vllm/attention/selector.py: pick the attention backend.

Order: the `attention_backend` engine argument, then MINIVLLM_ATTENTION_BACKEND,
then the default (Triton on a GPU, the PyTorch reference on the CPU, where
Triton only runs through its slow interpreter).
"""
from __future__ import annotations

from minivllm import envs


def get_attn_backend_name(requested: str | None, device: str) -> str:
    name = requested or envs.attention_backend() or ("triton" if device.startswith("cuda") else "torch")
    if name not in ("torch", "triton"):
        raise ValueError(f"attention backend must be 'torch' or 'triton', got {name!r} "
                         f"(from attention_backend or MINIVLLM_ATTENTION_BACKEND)")
    return name


def get_attn_impl(name: str):
    if name == "triton":
        import minivllm.kernels  # noqa: F401  sets TRITON_INTERPRET=1 on a CPU-only machine first
        from minivllm.attention.backends.triton_attn import TritonAttentionImpl
        return TritonAttentionImpl()
    from minivllm.attention.backends.torch_attn import TorchAttentionImpl
    return TorchAttentionImpl()
