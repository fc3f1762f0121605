"""Mirror of vllm/envs.py: the one place minivllm reads environment variables, each with its default.

vLLM exposes every variable as a lazily evaluated module attribute (`envs.VLLM_CACHE_ROOT`); here each
is a function named after what it gives, read at call time, so a test's `monkeypatch.setenv` takes effect
at once. `VARIABLES` lists them all with their defaults and meaning; the README's table is tested against it.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

VARIABLES = {  # name: (default, meaning)
    "MINIVLLM_CACHE_DIR": ("~/.cache/minivllm", "where converted GGUF models and the compiled CPU ops live"),
    "MINIVLLM_ENABLE_V1_MULTIPROCESSING": ("1", "0 runs EngineCore in the caller's process instead of a child"),
    "MINIVLLM_ATTENTION_BACKEND": ("", "cpu, torch or triton when the attention_backend argument is unset "
                                       "(default: triton on a GPU, cpu on the CPU)"),
    "MINIVLLM_CPU_KERNELS": ("1", "0 keeps every op on its PyTorch path instead of the compiled C library"),
    "MINIVLLM_CPU_PACKED_LINEAR": ("1", "0 leaves Linear weights unpacked, off the compiled CPU GEMM"),
    "MINIVLLM_KEEP_FREED_MEMORY": ("1", "0 lets glibc give freed buffers back to the OS after every step"),
    "MINIVLLM_LOGGING_LEVEL": ("INFO", "level of the minivllm logger"),
    "MINIVLLM_TORCH_PROFILER_DIR": ("", "a folder: turns the torch profiler on when profiler_config is unset "
                                        "(vLLM's older VLLM_TORCH_PROFILER_DIR)"),
    "CC": ("gcc, else cc", "the C compiler that builds csrc/cpu/ops.c"),
    "GOMP_SPINCOUNT": ("2000 in EngineCore's child", "how long an idle OpenMP thread spins before it sleeps: "
                       "short, so a CPU shared with other jobs does not collapse (unset if OMP_WAIT_POLICY is)"),
    "OMP_WAIT_POLICY": ("unset", "PASSIVE: idle OpenMP threads sleep at once; ACTIVE: they spin without end"),
    "TRITON_INTERPRET": ("1 without a GPU", "run Triton kernels through the interpreter (set before any kernel)"),
}


def _get(name: str) -> str | None:
    return os.environ.get(name) or None


def _on(name: str) -> bool:
    return os.environ.get(name, "1") != "0"


def cache_dir() -> Path:
    """MINIVLLM_CACHE_DIR: where converted GGUF models and the compiled CPU ops live (default ~/.cache/minivllm)."""
    return Path(_get("MINIVLLM_CACHE_DIR") or Path.home() / ".cache" / "minivllm").expanduser()


def c_compiler() -> str | None:
    """CC: the C compiler that builds csrc/cpu/ops.c (default: gcc, else cc, found on PATH)."""
    return _get("CC")


def cpu_kernels() -> bool:
    """MINIVLLM_CPU_KERNELS: "0" keeps every op on its PyTorch path instead of the compiled C library (default on)."""
    return _on("MINIVLLM_CPU_KERNELS")


def cpu_packed_linear() -> bool:
    """MINIVLLM_CPU_PACKED_LINEAR: "0" leaves Linear weights unpacked, off the compiled CPU GEMM (default on)."""
    return _on("MINIVLLM_CPU_PACKED_LINEAR")


def enable_v1_multiprocessing() -> bool:
    """MINIVLLM_ENABLE_V1_MULTIPROCESSING: "0" runs EngineCore in the caller's process (default: a child)."""
    return _on("MINIVLLM_ENABLE_V1_MULTIPROCESSING")


def attention_backend() -> str | None:
    """MINIVLLM_ATTENTION_BACKEND: the backend when the engine argument is unset (None: pick by device)."""
    return _get("MINIVLLM_ATTENTION_BACKEND")


def keep_freed_memory() -> bool:
    """MINIVLLM_KEEP_FREED_MEMORY: "0" lets glibc unmap big freed buffers after each step (default: keep them)."""
    return _on("MINIVLLM_KEEP_FREED_MEMORY")


def logging_level() -> str:
    """MINIVLLM_LOGGING_LEVEL: the minivllm logger's level (default INFO)."""
    return (_get("MINIVLLM_LOGGING_LEVEL") or "INFO").upper()


def torch_profiler_dir() -> str | None:
    """MINIVLLM_TORCH_PROFILER_DIR: a folder turns the torch profiler on when profiler_config is unset."""
    return _get("MINIVLLM_TORCH_PROFILER_DIR")


def use_triton_interpreter_without_gpu() -> None:
    """TRITON_INTERPRET: set to 1 when no GPU is present, unless the user chose; must run before any @triton.jit."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"


# How long (busy-wait iterations) an idle OpenMP thread of EngineCore's child spins before it sleeps.
CHILD_GOMP_SPINCOUNT = "2000"


@contextlib.contextmanager
def engine_core_child_environment():
    """While EngineCore's child starts: GOMP_SPINCOUNT=2000 unless the user set it or OMP_WAIT_POLICY.

    Between the hundreds of parallel regions of a step libgomp's threads wait for the next one. With
    a long spin (20,000 iterations; libgomp's own default is 300,000) a run beside one busy job took
    6-7x its time alone, every region waiting on a descheduled partner; sleeping at once
    (OMP_WAIT_POLICY=PASSIVE) pays a wake-up per region and ran 1.6-2x slower alone on these virtual
    CPUs. A short spin keeps the speed alone and kept the cost beside a neighbour to 1.9-2.7x
    (benchmarks/shared_cpu.py, 8 requests in bf16).
    libgomp reads this once, as it loads, so it is set for the child only (restored here at once);
    an in-process engine keeps whatever its process started with.
    """
    chosen = "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ
    if not chosen:
        os.environ["GOMP_SPINCOUNT"] = CHILD_GOMP_SPINCOUNT
    try:
        yield
    finally:
        if not chosen:
            del os.environ["GOMP_SPINCOUNT"]
