"""Mirror of vllm/envs.py: the one place minivllm reads environment variables, each with its default.

`ENVIRONMENT` is the one table: each variable's name, its default as docs/envs.md shows it, how its
raw value is read, and what it means (that page's table is tested against it). vLLM exposes every
variable as a lazily evaluated module attribute (`envs.VLLM_CACHE_ROOT`); here each has a function
named after what it gives, which reads the table at call time, so a test's `monkeypatch.setenv` takes
effect at once. Left out: vLLM's hundreds of other variables (its distributed, compile, ZMQ, usage
stats and plugin switches), and `VLLM_`-prefixed names: a variable here is minivllm's own or the
toolchain's (CC, OpenMP, Triton).
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable


def _flag(raw: str | None) -> bool:
    return raw != "0"  # on unless set to "0"


def _text(raw: str | None) -> str | None:
    return raw or None  # unset and empty both mean "not chosen"


@dataclass(frozen=True)
class EnvVar:
    name: str
    default: str  # as docs/envs.md shows it
    parse: Callable[[str | None], Any]  # the raw value (None when unset) -> what the engine uses
    meaning: str


ENVIRONMENT = [
    EnvVar("MINIVLLM_CACHE_DIR", "~/.cache/minivllm",
           lambda raw: Path(raw or Path.home() / ".cache" / "minivllm").expanduser(),
           "where converted GGUF models and the compiled CPU ops live"),
    EnvVar("MINIVLLM_ENABLE_V1_MULTIPROCESSING", "1", _flag,
           "0 runs EngineCore in the caller's process instead of a child"),
    EnvVar("MINIVLLM_ATTENTION_BACKEND", "", _text,
           "cpu, torch or triton when the attention_backend argument is unset (default: triton on a GPU, cpu on "
           "the CPU)"),
    EnvVar("MINIVLLM_CPU_KERNELS", "1", _flag, "0 keeps every op on its PyTorch path instead of the compiled C library"),
    EnvVar("MINIVLLM_CPU_PACKED_LINEAR", "1", _flag, "0 leaves Linear weights unpacked, off the compiled CPU GEMM"),
    EnvVar("MINIVLLM_CPU_SHM_COMM", "1", _flag,
           "0 sends the all-reduces and all-gathers of tensor-parallel ranks on one machine through gloo instead of "
           "a shared-memory segment"),
    EnvVar("MINIVLLM_SPEC_MAX_VERIFY_TOKENS", "20 on the CPU, unset on a GPU", _text,
           "speculative decoding: the most tokens (requests x (drafts + 1)) a step verifies; past it each request "
           "carries fewer drafts, down to none (0 or 'none': always num_speculative_tokens, vLLM's static k)"),
    EnvVar("MINIVLLM_KEEP_FREED_MEMORY", "1", _flag, "0 lets glibc give freed buffers back to the OS after every step"),
    EnvVar("MINIVLLM_LOGGING_LEVEL", "INFO", lambda raw: (raw or "INFO").upper(), "level of the minivllm logger"),
    EnvVar("MINIVLLM_TORCH_PROFILER_DIR", "", _text,
           "a folder: turns the torch profiler on when profiler_config is unset (vLLM's older "
           "VLLM_TORCH_PROFILER_DIR)"),
    EnvVar("CC", "gcc, else cc", _text, "the C compiler that builds csrc/cpu/*.c"),
    EnvVar("GOMP_SPINCOUNT", "2000 in EngineCore's child", _text,
           "how long an idle OpenMP thread spins before it sleeps: short, so a CPU shared with other jobs does not "
           "collapse (unset if OMP_WAIT_POLICY is)"),
    EnvVar("OMP_WAIT_POLICY", "unset", _text,
           "PASSIVE: idle OpenMP threads sleep at once; ACTIVE: they spin without end"),
    EnvVar("OMP_NUM_THREADS", "cores / ranks in each tensor-parallel worker", _text,
           "OpenMP threads; unset, each tensor-parallel rank on a machine takes its share of the cores, bound to "
           "them"),
    EnvVar("TRITON_INTERPRET", "1 without a GPU", _text,
           "run Triton kernels through the interpreter (set before any kernel)"),
]
_BY_NAME = {var.name: var for var in ENVIRONMENT}


def get(name: str) -> Any:
    """The variable's value now, read through its table entry."""
    return _BY_NAME[name].parse(os.environ.get(name))


def cache_dir() -> Path:
    return get("MINIVLLM_CACHE_DIR")


def c_compiler() -> str | None:
    return get("CC")  # None: gcc, else cc, found on PATH


def cpu_kernels() -> bool:
    return get("MINIVLLM_CPU_KERNELS")


def cpu_packed_linear() -> bool:
    return get("MINIVLLM_CPU_PACKED_LINEAR")


def cpu_shm_comm() -> bool:
    return get("MINIVLLM_CPU_SHM_COMM")


# The CPU's default bound on the tokens a speculative step verifies (benchmarks/spec_decode.py measures it):
# past a few rows a CPU decode step is compute-bound, so a draft costs about what a plain token does.
CPU_SPEC_MAX_VERIFY_TOKENS = 20


def spec_max_verify_tokens(device: str) -> int | None:
    """The bound on requests x (drafts + 1) of a speculative step (spec_decode/config.py), None for none."""
    raw = get("MINIVLLM_SPEC_MAX_VERIFY_TOKENS")
    if raw is None:
        return CPU_SPEC_MAX_VERIFY_TOKENS if device == "cpu" else None
    if raw.lower() == "none":
        return None
    if not raw.isdigit():
        raise ValueError(f"MINIVLLM_SPEC_MAX_VERIFY_TOKENS={raw!r}: give a positive int, or 0 / none for no bound")
    return int(raw) or None


def enable_v1_multiprocessing() -> bool:
    return get("MINIVLLM_ENABLE_V1_MULTIPROCESSING")


def attention_backend() -> str | None:
    return get("MINIVLLM_ATTENTION_BACKEND")  # None: pick by device


def keep_freed_memory() -> bool:
    return get("MINIVLLM_KEEP_FREED_MEMORY")


def omp_num_threads() -> str | None:
    return get("OMP_NUM_THREADS")


def logging_level() -> str:
    return get("MINIVLLM_LOGGING_LEVEL")


def torch_profiler_dir() -> str | None:
    return get("MINIVLLM_TORCH_PROFILER_DIR")


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
    a long spin (libgomp's own default is 300,000 iterations) a run beside one busy job spends its
    regions waiting on a descheduled partner; sleeping at once (OMP_WAIT_POLICY=PASSIVE) pays a
    wake-up per region even alone. A short spin keeps the speed alone and bounds the cost beside a
    neighbour (benchmarks/shared_cpu.py measures the three).
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
