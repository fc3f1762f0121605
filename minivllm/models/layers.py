"""Mirror of vllm/model_executor/layers/ (layernorm.py, activation.py, rotary_embedding.py): shared building blocks.

Numerics follow HF transformers so greedy decoding matches it token for token:
RMSNorm normalises in float32; rotary tables are built in float32 from the
same inverse frequencies and indexed by each packed token's position.
RMSNorm (with the residual add fused in, as vLLM's fused_add_rms_norm),
SiluAndMul and the rotary embedding are CustomOps: `forward_native` is the
PyTorch formula, `forward_cpu` the compiled op (minivllm/_C.py), and which one
runs is picked once, in minivllm/_custom_ops.py. The linear layers are in
linear.py (their CPU GEMM in utils.py), the vocabulary's in vocab_parallel_embedding.py.
Left out: rope scaling variants other than "default" and "llama3".
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from minivllm import _C
from minivllm.models.custom_op import CustomOp


class RMSNorm(CustomOp):
    """weight * x / rms(x). Given a residual, first adds x into it and normalises the sum, returning
    (normed, new residual): vLLM's fused_add_rms_norm, which saves the decoder layer a separate add."""

    def __init__(self, hidden_size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward_cpu(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is None:
            return _C.rms_norm(x, self.weight, self.eps)
        _C.fused_add_rms_norm(x, residual, self.weight, self.eps)  # in place: residual += x; x = norm(residual)
        return x, residual

    def forward_native(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        if residual is not None:
            residual = x = x + residual
            return self._norm(x), residual
        return self._norm(x)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype == torch.float32:  # one fused op; same formula as below
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class SiluAndMul(CustomOp):
    """x [num_tokens, 2 * d] -> silu(x[:, :d]) * x[:, d:]: the gated MLP's activation in one pass."""

    def forward_cpu(self, x: torch.Tensor) -> torch.Tensor:
        return _C.silu_and_mul(x)

    def forward_native(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up


def _rope_inv_freq(head_dim: int, rope: dict) -> torch.Tensor:
    base = float(rope.get("rope_theta", 10000.0))
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "llama3":  # wavelength-dependent scaling of Llama 3.1
        factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope["original_max_position_embeddings"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        mid = (1 - smooth) * scaled / factor + smooth * scaled
        is_mid = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(is_mid, mid, scaled)
    raise ValueError(f"rope_type {kind!r} is not supported by minivllm (only 'default' and 'llama3')")


class RotaryEmbedding(CustomOp):
    """Neox-style rotary embedding (rotate halves), as HF's Llama applies it."""

    def __init__(self, head_dim: int, max_position: int, rope: dict) -> None:
        super().__init__()
        inv_freq = _rope_inv_freq(head_dim, rope)
        freqs = torch.arange(max_position, dtype=torch.float32).unsqueeze(1) * inv_freq.unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)  # [max_position, head_dim]
        self.register_buffer("cos_cache", emb.cos(), persistent=False)
        self.register_buffer("sin_cache", emb.sin(), persistent=False)

        self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    # positions [num_tokens]; q [num_tokens, num_heads, head_dim]; k [num_tokens, num_kv_heads, head_dim]
    def forward_cpu(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        _C.rotary_embedding(positions, q, k, self.cos_cache, self.sin_cache)  # in place
        return q, k

    def forward_native(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        if self._last is None or self._last[0] is not positions:  # every layer of a step shares one lookup
            cos = self.cos_cache[positions].unsqueeze(1).to(q.dtype)  # [num_tokens, 1, head_dim]
            sin = self.sin_cache[positions].unsqueeze(1).to(q.dtype)
            self._last = (positions, cos, sin)
        _, cos, sin = self._last
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)
