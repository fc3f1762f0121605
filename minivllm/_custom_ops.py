"""Mirror of vllm/_custom_ops.py: the op entry points, and the one place that picks which implementation runs.

vLLM's _custom_ops.py is the Python face of its compiled ops; which kernel serves a layer follows from the
platform and the attention backend, each settled once. minivllm settles every such choice here, once per engine
(or per op, on its first call), and never changes it per call:

  attention backend | KV write (reshape_and_cache_flash)             | paged read
  "cpu"             | C reshape_and_cache       (csrc/cpu/cache.c)   | C paged_attention   (csrc/cpu/cpu_attn.c)
  "torch"           | PyTorch index_copy_ by slot (torch_attn.py)    | PyTorch gather by block_table + SDPA
  "triton"          | Triton reshape_and_cache_flash (kernels/)      | Triton unified_attention (kernels/)

  the other ops (models/layers.py)  | CPU, float32 or bfloat16, library built | otherwise
  rms_norm, fused_add_rms_norm      | C csrc/cpu/layernorm.c                  | PyTorch forward_native
  silu_and_mul                      | C csrc/cpu/activation.c                 | PyTorch forward_native
  rotary_embedding                  | C csrc/cpu/pos_encoding.c               | PyTorch forward_native
  linear (models/linear.py)         | C csrc/cpu/gemm.c for small batches,    | F.linear
                                    | oneDNN above (models/utils.py, at load) |

The default backend is Triton on a GPU; on the CPU "cpu" where the compiled ops take the model's dtype, else
"torch". A backend asked for that cannot run is a ValueError naming the fix, and a tensor a compiled op cannot
take is one too: nothing falls back to another implementation per call. The engine logs once which KV write and
paged read run. Left out: CUDA ops, fp8 caches and scales, quantized GEMMs, vLLM's per-op enable switches.
"""
from __future__ import annotations

import functools
import logging
from typing import Optional

import torch

# Importing the package first sets TRITON_INTERPRET on CPU-only machines, before any @triton.jit kernel is
# decorated; the kernel modules themselves are imported on first use, so a CPU engine never loads Triton.
import minivllm.kernels  # noqa: F401
from minivllm import _C, envs

logger = logging.getLogger("minivllm")

# backend -> (KV write, paged read): what runs, and where it is written
ATTENTION_BACKENDS = {
    "cpu": ("C reshape_and_cache (csrc/cpu/cache.c)", "C paged_attention (csrc/cpu/cpu_attn.c)"),
    "torch": ("PyTorch index_copy_ by slot_mapping (attention/backends/torch_attn.py)",
              "PyTorch gather by block_table + SDPA (attention/backends/torch_attn.py)"),
    "triton": ("Triton reshape_and_cache_flash (kernels/reshape_and_cache.py)",
               "Triton unified_attention (kernels/unified_attention.py)"),
}
def compiled_cpu_ops_serve(device: str | torch.device, dtype: torch.dtype | str | None) -> bool:
    """True where the compiled CPU ops run: on the CPU, in float32 or bfloat16 (None or "auto": not known), built."""
    if isinstance(dtype, str):
        dtype = None if dtype == "auto" else getattr(torch, dtype)
    return torch.device(device).type == "cpu" and (dtype is None or dtype in _C.DTYPES) and _C.available()


def choose_attention_backend(requested: str | None, device: str, dtype: torch.dtype | str | None = None) -> str:
    """The backend of a run: `requested`, else MINIVLLM_ATTENTION_BACKEND, else the device's default.

    E.g. (None, "cuda") -> "triton"; (None, "cpu", float32) -> "cpu" when the library builds, else "torch";
    (None, "cpu", float16) -> "torch"; ("cpu", "cpu", float16) -> ValueError naming the fix.
    """
    name = requested or envs.attention_backend()
    if name is None:
        if torch.device(device).type == "cuda":
            return "triton"
        return "cpu" if compiled_cpu_ops_serve(device, dtype) else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend must be one of {tuple(ATTENTION_BACKENDS)}, got {name!r} "
                         f"(from attention_backend or MINIVLLM_ATTENTION_BACKEND)")
    if name == "cpu" and not compiled_cpu_ops_serve(device, dtype):
        asked = f"device={str(device)!r}" + ("" if dtype is None else f", dtype={dtype}")
        why = (f"they run on the CPU in float32 or bfloat16, not {asked}" if _C.available()
               else "they are switched off or did not build (see the warning logged above)")
        raise ValueError(f"attention backend 'cpu' runs the compiled CPU kernels, and {why}. Choose "
                         f"attention_backend='torch' (any device and dtype), or dtype='float32' or 'bfloat16'")
    return name


def log_attention_ops(backend: str) -> None:
    """The engine's one line saying which KV write and which paged read its attention layers run."""
    write, read = ATTENTION_BACKENDS[backend]
    logger.info("attention backend %s: KV write = %s, paged read = %s", backend, write, read)


def choose_custom_op_forward(device: torch.device, dtype: torch.dtype) -> str:
    """CustomOp's method for tensors on `device` in `dtype`: "forward_cpu" (the C op) or "forward_native"."""
    if compiled_cpu_ops_serve(device, dtype):
        return "forward_cpu"
    if device.type == "cpu":
        _log_native_once(str(dtype).removeprefix("torch."), _C.available())
    return "forward_native"


@functools.cache
def _log_native_once(dtype: str, built: bool) -> None:
    why = f"the compiled CPU ops take float32 and bfloat16, not {dtype}" if built else "the compiled CPU ops are off"
    logger.info("RMSNorm, SiluAndMul and the rotary embedding run their PyTorch forward_native: %s", why)


def pack_small_batch_linear(weight: torch.Tensor) -> torch.Tensor | None:
    """W [n, k] -> the C GEMM's panels where it will run, else None (oneDNN only): float32 with the library
    built; bfloat16 where the library has an AVX-512 bf16 tile (AVX512_BF16's dot products, or FMAs on widened
    weights; without AVX-512 the plain-C tile would be slower than oneDNN's bf16 kernels, so bf16 stays there)."""
    if not compiled_cpu_ops_serve(weight.device, weight.dtype):
        return None
    if weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and _C.linear_bf16_tile() > 0):
        return _C.pack_linear_weight(weight)
    return None


def reshape_and_cache_flash(
    key: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    value: torch.Tensor,  # [num_tokens, num_kv_heads, head_size]
    key_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    value_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    slot_mapping: torch.Tensor,  # [num_tokens], slot = block * block_size + offset; -1 = skip
    kv_cache_dtype: str = "auto",
    k_scale: Optional[torch.Tensor] = None,
    v_scale: Optional[torch.Tensor] = None,
) -> None:
    """The Triton KV write: token i's K/V to cache slot slot_mapping[i] (in place)."""
    if kv_cache_dtype != "auto":
        raise NotImplementedError(
            f"kv_cache_dtype={kv_cache_dtype!r} is not supported by minivllm; "
            "only 'auto' (cache dtype == model dtype) is implemented")
    del k_scale, v_scale  # only meaningful for fp8 caches
    from minivllm.kernels.reshape_and_cache import triton_reshape_and_cache_flash
    triton_reshape_and_cache_flash(key, value, key_cache, value_cache, slot_mapping)


def unified_attention(
    q: torch.Tensor,  # [num_tokens, num_q_heads, head_size]
    k: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    v: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_size]
    out: torch.Tensor,  # [num_tokens, num_q_heads, head_size]
    cu_seqlens_q: torch.Tensor,  # [num_seqs + 1] int32 (query_start_loc)
    max_seqlen_q: int,
    seqused_k: torch.Tensor,  # [num_seqs] int32 (seq_lens, incl. new tokens)
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    block_table: torch.Tensor,  # [num_seqs, max_num_blocks_per_seq] int32
) -> None:
    """The Triton paged read over a mixed prefill/decode batch; writes `out` in place."""
    from minivllm.kernels.unified_attention import unified_attention as triton_unified_attention
    triton_unified_attention(q, k, v, out, cu_seqlens_q, max_seqlen_q, seqused_k, max_seqlen_k, softmax_scale,
                             causal, block_table)
