"""Mirror of vllm/distributed/: process groups (parallel_state.py) and the collectives over them
(communication_op.py), used by tensor parallelism.

vLLM's `cleanup_dist_env_and_memory()` tears down the process groups, then frees what the
engine held on the device. minivllm's groups live in the worker processes and end with them (a
TP=1 engine joins none); what remains is the memory: a dropped LLM's EngineCore child is stopped
and reaped by the garbage collector's finalizer, an in-process EngineCore's tensors are freed, and
the C heap is handed back to the OS (the engine turns glibc's trimming off while it runs, see
worker.gpu_worker.keep_freed_memory).
"""
from __future__ import annotations

import ctypes
import gc


def cleanup_dist_env_and_memory(shutdown_ray: bool = False) -> None:
    """Free the memory of engines no longer referenced (`del llm` first). `shutdown_ray` is a no-op here."""
    gc.collect()
    import torch
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass  # not glibc: the allocator keeps its own policy


__all__ = ["cleanup_dist_env_and_memory"]
