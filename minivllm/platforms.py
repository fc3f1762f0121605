"""Mirror of vllm/platforms/ (cpu.py's dtype choice), for this process's CPU: what it can run natively.

vLLM asks its Platform object which dtypes the device runs and resolves dtype="auto" against
it; minivllm has one platform question that changes a result, whether the CPU does bf16 in
hardware, and answers it from the kernel's instruction-set flags. Left out: GPU platforms (on
"cuda" minivllm takes torch's word), NUMA and thread binding.
"""
from __future__ import annotations

import functools
import platform
from pathlib import Path

# The flags behind native bf16: dot products (avx512_bf16) or tile matrix units (amx_bf16).
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


@functools.lru_cache(maxsize=1)
def cpu_flags() -> frozenset[str]:
    """The instruction-set flags of /proc/cpuinfo (empty where that file cannot be read)."""
    try:
        line = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return frozenset()
    return frozenset(line.split(":", 1)[1].split())


def cpu_id() -> str:
    """The machine and its flags: what -march=native may emit, so it keys the compiled library."""
    return platform.machine() + " ".join(sorted(cpu_flags()) or [platform.processor()])


def cpu_has_native_bf16() -> bool:
    return any(flag in cpu_flags() for flag in NATIVE_BF16_FLAGS)


def resolve_dtype(dtype: str, checkpoint_dtype: str | None, device: str) -> str:
    """The dtype a run uses: `dtype` itself, or for "auto" as vLLM resolves it.

    "auto" takes the checkpoint's torch_dtype, except that a float32 (or, on the CPU, float16)
    checkpoint runs in bfloat16 where the CPU has native bf16 (AVX512_BF16 or AMX) and in float32
    where it does not; on a GPU a float32 checkpoint runs in bfloat16. A checkpoint without a
    torch_dtype counts as float32. E.g. SmolLM2 converted from GGUF (float32) -> "bfloat16" on a
    Xeon with AMX or an EPYC with AVX512_BF16, "float32" on an older AVX2 CPU.
    """
    if dtype != "auto":
        return dtype
    found = str(checkpoint_dtype or "float32").removeprefix("torch.")
    if found not in ("float32", "float16", "bfloat16"):
        raise ValueError(f"dtype='auto': the checkpoint's torch_dtype {found!r} is not one minivllm runs; "
                         f"pass dtype='float32' or dtype='bfloat16'")
    if device == "cuda":
        return "bfloat16" if found == "float32" else found
    if found == "bfloat16":
        return found
    return "bfloat16" if cpu_has_native_bf16() else "float32"
