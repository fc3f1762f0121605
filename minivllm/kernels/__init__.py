"""Triton kernels of minivllm (mirrors the Triton kernels under vllm/attention/ops/).

Picks the Triton interpreter when no GPU is present; leaves out every
non-Triton (CUDA C++) kernel and any autotuning.

Why the ordering here matters: in triton 3.9 `@triton.jit` reads
`TRITON_INTERPRET` (via `triton.knobs.runtime.interpret`) at *decoration* time,
i.e. when a kernel module is imported, not when `triton` itself is imported.
Importing any `minivllm.kernels.<module>` runs this file first, so the variable
is always set before our kernels are decorated, even if some other code has
already imported `triton`. The kernel modules are deliberately not imported
eagerly from here.
"""

from minivllm import envs

envs.use_triton_interpreter_without_gpu()


def next_power_of_2(n: int) -> int:
    """Smallest power of two >= n (n >= 1); used to pad `tl.arange` extents."""
    return 1 << (max(int(n), 1) - 1).bit_length()
