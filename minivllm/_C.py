"""Mirror of vllm._C, the compiled op library, for the CPU: csrc/cpu/*.c built on first use and called via ctypes.

vLLM ships its C++ ops prebuilt inside the wheel; minivllm compiles its C files (csrc/cpu/, one per vLLM file: cache,
cpu_attn, layernorm, activation, pos_encoding, gemm, shm) into one library with the system's C compiler the first time
an engine starts on the CPU (a second or two; csrc/build.py), cached under MINIVLLM_CACHE_DIR/ops/, keyed by the
sources, the flags and the CPU. SIGNATURES types every exported function for ctypes, written out from csrc/cpu/ops.h
(a test parses the C and compares). Each wrapper checks dtypes and layouts, then hands raw pointers to C; the library
runs on torch's own OpenMP thread pool (the same libgomp), so `torch.set_num_threads` governs it too.

Without a compiler, with MINIVLLM_CPU_KERNELS=0, or on any failure to load (a refused folder, a dlopen error, a missing
symbol), `available()` is False (logged once); which op then runs instead is decided once, in minivllm/_custom_ops.py.
The ops take float32 and bfloat16 (arithmetic in float32, results rounded to bf16 where PyTorch's own ops round: see
csrc/cpu/cpu_types.h). A tensor an op cannot take is a ValueError, never a silent detour. Left out: CUDA, fp16, fp8,
torch.ops registration (ctypes instead).
"""
from __future__ import annotations

import ctypes
import logging
import subprocess
from pathlib import Path

import torch

from minivllm import envs
from minivllm.csrc import build
from minivllm.utils.math_utils import cdiv

logger = logging.getLogger("minivllm")

# The C prototypes of csrc/cpu/ops.h, for ctypes: pointers travel as c_void_p (the wrappers pass
# data_ptr()), int64_t as c_int64, int as c_int, float as c_float; None is a void return.
_P, _I64, _INT, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
SIGNATURES: dict[str, tuple[list, object]] = {
    # cache.c: key, value, key_cache, value_cache, slot_mapping, num_tokens, row, key_stride, value_stride, dtype
    "reshape_and_cache": ([_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _INT], None),
    # cpu_attn.c: out, query, key_cache, value_cache, block_table, query_start_loc, seq_lens, num_reqs, num_heads,
    # num_kv_heads, head_size, block_size, block_table_stride, q_stride, out_stride, scale, dtype
    "paged_attention": ([_P] * 7 + [_I64] * 8 + [_F, _INT], None),
    # layernorm.c: out, x, weight, num_tokens, hidden, x_stride, eps, dtype / x, residual, weight, num_tokens, ...
    "rms_norm": ([_P, _P, _P, _I64, _I64, _I64, _F, _INT], None),
    "fused_add_rms_norm": ([_P, _P, _P, _I64, _I64, _F, _INT], None),
    # activation.c: out, x, num_tokens, d, dtype
    "silu_and_mul": ([_P, _P, _I64, _I64, _INT], None),
    # pos_encoding.c: positions, q, k, cos/sin_cache, num_tokens, num_heads, num_kv_heads, head_size, q/k_stride, dtype
    "rotary_embedding": ([_P] * 5 + [_I64] * 6 + [_INT], None),
    # gemm.c: () -> PANEL / packed, weight, n, k / out, x, packed, bias, m, n, k, x_stride
    "panel_width": ([], _I64), "pack_linear_weight": ([_P, _P, _I64, _I64], None),
    "linear_small_batch": ([_P, _P, _P, _P, _I64, _I64, _I64, _I64], None),
    "linear_bf16_tile": ([], _INT),  # () -> 2 AVX512_BF16 dot products, 1 AVX-512 FMAs, 0 plain C
    "pack_linear_weight_bf16": ([_P, _P, _I64, _I64], None), "linear_small_batch_bf16": ([_P] * 4 + [_I64] * 4, None),
    # shm.c (0 or -errno): handle [, name, rank, world_size, slot_bytes, timeout_ms / data, numel, dtype / in, out, n]
    "shm_handle_size": ([], _I64), "shm_group_open": ([_P, _P] + [_I64] * 4, _INT), "shm_group_close": ([_P], None),
    "shm_group_unlink": ([_P], _INT), "shm_all_reduce": ([_P, _P, _I64, _INT], _INT),
    "shm_all_gather": ([_P, _P, _P, _I64], _INT),
}
_lib: ctypes.CDLL | None = None
_tried = False


def open_library(path: Path) -> ctypes.CDLL:
    """dlopen `path` unchecked and type every function; a missing one is an AttributeError."""
    lib = ctypes.CDLL(str(path))
    for name, (argtypes, restype) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def load() -> ctypes.CDLL | None:
    """The library, built if needed; None (once logged) where it cannot be had, is refused, or is switched off."""
    global _lib, _tried
    if _tried:
        return _lib
    _tried = True
    if not envs.cpu_kernels():
        return None
    path = None
    try:
        path = build.ensure_library()  # built by us and recorded, or an exception saying why not
        _lib = open_library(path)
    except AttributeError as e:
        logger.warning("CPU kernels unavailable, using the PyTorch path instead: %s lacks a function minivllm "
                       "calls (%s). Delete it and its .sha256 to rebuild, or set MINIVLLM_CPU_KERNELS=0.", path, e)
    except (OSError, RuntimeError, subprocess.SubprocessError) as e:
        logger.warning("CPU kernels unavailable, using the PyTorch path instead: %s (MINIVLLM_CPU_KERNELS=0 skips "
                       "them without this warning)", e)
    return _lib


def available() -> bool:
    return load() is not None


DTYPES = {torch.float32: 0, torch.bfloat16: 1}  # cpu_types.h's DTYPE_F32 / DTYPE_BF16


def usable(*tensors: torch.Tensor) -> bool:
    """True when the compiled ops can serve these tensors: all on the CPU in one dtype the ops take
    (float32 or bfloat16), library loaded."""
    dtype = tensors[0].dtype
    return (dtype in DTYPES and all(t.device.type == "cpu" and t.dtype == dtype for t in tensors)
            and available())


def _dtype(*tensors: torch.Tensor) -> int:
    """The C code for the tensors' one dtype; a ValueError for a mix or a dtype it does not take."""
    for t in tensors:  # a loop, not a set: this runs for every op of every layer
        if t.dtype != tensors[0].dtype or t.dtype not in DTYPES:
            got = sorted({str(t.dtype) for t in tensors})
            raise ValueError(f"the compiled ops take float32 or bfloat16 tensors of one dtype, got {got}: run the "
                             "model in float32 or bfloat16, or keep the CPU ops off (MINIVLLM_CPU_KERNELS=0, "
                             "attention_backend='torch')")
    return DTYPES[tensors[0].dtype]


_ANY_LAYOUT = " (the 'torch' attention backend takes any layout)"


def heads_contiguous(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Two [num_tokens, heads, head_size] views whose heads sit back to back within each token (tokens at any
    stride). Written out for two (no generator): it runs for three ops of every layer."""
    return (a.dim() == 3 and a.stride(2) == 1 and a.stride(1) == a.shape[2] and b.dim() == 3 and b.stride(2) == 1
            and b.stride(1) == b.shape[2])


def _rows(x: torch.Tensor, width: int) -> int:
    """Row stride of a 2-D view whose rows are each contiguous."""
    if x.dim() != 2 or x.shape[1] != width or (x.shape[0] > 1 and x.stride(1) != 1):
        raise ValueError(f"expected rows of {width} contiguous floats, got shape {tuple(x.shape)} strides {x.stride()}")
    return x.stride(0)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., hidden] (2-D rows may be strided; other layouts are copied) -> weight * x / rms(x), a new tensor."""
    hidden = weight.shape[0]
    rows = x if x.dim() == 2 and x.stride(1) == 1 else x.reshape(-1, hidden).contiguous()  # [num_tokens, hidden]
    out = torch.empty(rows.shape[0], hidden, dtype=x.dtype)
    _lib.rms_norm(out.data_ptr(), rows.data_ptr(), weight.data_ptr(), rows.shape[0], hidden, _rows(rows, hidden),
                  eps, _dtype(rows, weight))
    return out.view(*x.shape[:-1], hidden)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float) -> None:
    """In place: residual += x, then x = rms_norm(residual). Both contiguous [num_tokens, hidden]."""
    if not (x.is_contiguous() and residual.is_contiguous() and x.shape == residual.shape):
        raise ValueError("fused_add_rms_norm needs two contiguous tensors of one shape (pass x.contiguous())")
    _lib.fused_add_rms_norm(x.data_ptr(), residual.data_ptr(), weight.data_ptr(), x.shape[0], x.shape[1], eps,
                               _dtype(x, residual, weight))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [num_tokens, 2 * d] contiguous -> silu(x[:, :d]) * x[:, d:], [num_tokens, d]."""
    x = x.contiguous()
    d = x.shape[-1] // 2
    out = torch.empty(*x.shape[:-1], d, dtype=x.dtype)
    _lib.silu_and_mul(out.data_ptr(), x.data_ptr(), x.numel() // (2 * d) if d else 0, d, _dtype(x))
    return out


def rotary_embedding(positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor, cos_cache: torch.Tensor,
                     sin_cache: torch.Tensor) -> None:
    """In place, neox style. query [num_tokens, num_heads, head_size], key [num_tokens, num_kv_heads, head_size]:
    each head's row contiguous, tokens at any stride; cos/sin_cache [max_position, head_size] contiguous."""
    num_tokens, num_heads, head_size = query.shape
    num_kv_heads = key.shape[1]
    if not heads_contiguous(query, key):
        raise ValueError(f"rotary_embedding needs contiguous heads, got strides {query.stride()}, {key.stride()}")
    positions = positions.to(torch.int64).contiguous()
    _lib.rotary_embedding(positions.data_ptr(), query.data_ptr(), key.data_ptr(), cos_cache.data_ptr(),
                          sin_cache.data_ptr(), num_tokens, num_heads, num_kv_heads, head_size,
                          query.stride(0), key.stride(0), _dtype(query, key, cos_cache, sin_cache))


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    """key/value [num_tokens, num_kv_heads, head_size] (each token's heads contiguous, tokens at any stride)
    -> slot slot_mapping[t] of key/value_cache [num_blocks, block_size, num_kv_heads, head_size]; -1 skipped."""
    num_tokens, num_kv_heads, head_size = key.shape
    row = num_kv_heads * head_size
    if not heads_contiguous(key, value):
        raise ValueError(f"reshape_and_cache needs contiguous heads, got strides {key.stride()}, {value.stride()}"
                         + _ANY_LAYOUT)
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("reshape_and_cache needs contiguous caches" + _ANY_LAYOUT)
    slot_mapping = slot_mapping.to(torch.int64).contiguous()
    _lib.reshape_and_cache(key.data_ptr(), value.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
                           slot_mapping.data_ptr(), num_tokens, row, key.stride(0), value.stride(0),
                           _dtype(key, value, key_cache, value_cache))


def paged_attention(output: torch.Tensor, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_table: torch.Tensor, query_start_loc: torch.Tensor, seq_lens: torch.Tensor,
                    scale: float) -> None:
    """Causal attention for every query row of a step, each request's history read straight from the paged cache.

    output/query [num_tokens, num_heads, head_size]; key/value_cache [num_blocks, block_size, num_kv_heads,
    head_size] contiguous; block_table [num_reqs, max_blocks]. Request r's query rows are query_start_loc[r] ..
    query_start_loc[r + 1] - 1, the last of its seq_lens[r] positions: row j of q_len sits at position
    seq_lens[r] - q_len + j and sees keys 0 .. that position. Rows past query_start_loc[-1] are left alone.
    """
    num_heads, head_size = query.shape[1:]
    num_blocks, block_size, num_kv_heads, _ = key_cache.shape
    if num_heads % num_kv_heads or query_start_loc.numel() != seq_lens.numel() + 1:
        raise ValueError(f"{num_heads} query heads over {num_kv_heads} KV heads, {query_start_loc.numel()} query "
                         f"starts for {seq_lens.numel()} requests: heads must split evenly, starts be requests + 1")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous() and block_table.stride(1) == 1):
        raise ValueError("paged_attention needs contiguous caches and block_table rows" + _ANY_LAYOUT)
    if not heads_contiguous(query, output):
        raise ValueError(f"paged_attention needs contiguous heads, got strides {query.stride()}, {output.stride()}"
                         + _ANY_LAYOUT)
    block_table = block_table.to(torch.int32)
    query_start_loc, seq_lens = query_start_loc.to(torch.int32).contiguous(), seq_lens.to(torch.int32).contiguous()
    _lib.paged_attention(output.data_ptr(), query.data_ptr(), key_cache.data_ptr(), value_cache.data_ptr(),
                         block_table.data_ptr(), query_start_loc.data_ptr(), seq_lens.data_ptr(), seq_lens.numel(),
                         num_heads, num_kv_heads, head_size, block_size, block_table.stride(0), query.stride(0),
                         output.stride(0), scale, _dtype(output, query, key_cache, value_cache))


def linear_bf16_tile() -> int:
    """The bf16 small-batch GEMM's tile: 2 AVX512_BF16 dot products, 1 FMAs on widened weights, 0 plain C."""
    return _lib.linear_bf16_tile()


def pack_linear_weight(weight: torch.Tensor) -> torch.Tensor:
    """W [n, k] -> linear_small_batch's panels: float32 [cdiv(n, 32), k, 32], bf16 [cdiv(n, 32), cdiv(k, 2), 32, 2]
    (k in pairs for dot products); columns (and an odd k's partner) past the weight are zero."""
    if weight.dtype not in DTYPES:
        raise ValueError(f"the small-batch linear takes float32 or bfloat16 weights, got {weight.dtype}")
    n, k = weight.shape
    weight = weight.detach().contiguous()
    panel, bf = _lib.panel_width(), weight.dtype == torch.bfloat16
    packed = torch.empty(cdiv(n, panel), *((cdiv(k, 2), panel, 2) if bf else (k, panel)), dtype=weight.dtype)
    (_lib.pack_linear_weight_bf16 if bf else _lib.pack_linear_weight)(packed.data_ptr(), weight.data_ptr(), n, k)
    return packed


def linear_small_batch(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x [m, k] (rows may be strided) @ W^T + bias -> [m, n], W as pack_linear_weight's panels, all one dtype."""
    if x.dtype != packed.dtype or (bias is not None and bias.dtype != packed.dtype):  # cheap: 121 calls a step
        _dtype(x, packed, *([] if bias is None else [bias]))  # raises, naming the dtypes
    bf, k = packed.dtype == torch.bfloat16, x.shape[-1]
    if packed.shape[1] != (cdiv(k, 2) if bf else k):
        raise ValueError(f"x has {k} columns but the panels {tuple(packed.shape)} were packed for another width")
    x_stride = _rows(x, k)
    out = torch.empty(x.shape[0], n, dtype=x.dtype)
    (_lib.linear_small_batch_bf16 if bf else _lib.linear_small_batch)(
        out.data_ptr(), x.data_ptr(), packed.data_ptr(), None if bias is None else bias.data_ptr(), x.shape[0], n, k,
        x_stride)
    return out
