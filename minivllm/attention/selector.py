"""Mirror of vllm/attention/selector.py: pick the attention backend.

Order: the `attention_backend` engine argument, then MINIVLLM_ATTENTION_BACKEND,
then the default: Triton on a GPU; on the CPU the compiled kernel ("cpu") when
the C library builds, else the PyTorch reference ("torch"). Triton also runs on
the CPU, through its slow interpreter, when asked for.
"""
from __future__ import annotations

from minivllm import envs

BACKENDS = ("cpu", "torch", "triton")


def get_attn_backend_name(requested: str | None, device: str) -> str:
    name = requested or envs.attention_backend() or _default_backend(device)
    if name not in BACKENDS:
        raise ValueError(f"attention backend must be one of {BACKENDS}, got {name!r} "
                         f"(from attention_backend or MINIVLLM_ATTENTION_BACKEND)")
    return name


def _default_backend(device: str) -> str:
    if device.startswith("cuda"):
        return "triton"
    from minivllm import _C
    return "cpu" if _C.available() else "torch"


def get_attn_impl(name: str):
    if name == "triton":
        import minivllm.kernels  # noqa: F401  sets TRITON_INTERPRET=1 on a CPU-only machine first
        from minivllm.attention.backends.triton_attn import TritonAttentionImpl
        return TritonAttentionImpl()
    if name == "cpu":
        from minivllm.attention.backends.cpu_attn import CPUAttentionImpl
        return CPUAttentionImpl()
    from minivllm.attention.backends.torch_attn import TorchAttentionImpl
    return TorchAttentionImpl()
