"""Memory helpers. vLLM's vllm/utils/mem_utils.py measures memory; what is here has no counterpart there: it lays
out the CPU's big tensors so that a decode step reads them at the memory's speed.

The KV cache is allocated on transparent huge pages (`zeros`): attention reads its blocks scattered over
hundreds of MB, a TLB miss every 4 KiB page on small pages.

A decode step reads every weight of the model once, one GEMM after the other. Packed one by one, each
layer's C GEMM panels (models/utils.py) sit in their own allocation, between the oneDNN copies of the same
weights (packed just before them). Moved into one buffer, back to back in the order a forward uses them (the
loader's process_weights_after_loading), they stream as one run, and the buffer is advised for transparent huge
pages (Linux; fewer TLB misses over hundreds of MB). Its effect is measured by the benchmarks (docs/performance.md).
"""
from __future__ import annotations

import ctypes
import sys

import torch

from minivllm.utils.math_utils import cdiv

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h


def _advise_huge_pages(address: int, length: int) -> None:
    """Ask Linux to back [address, address + length) with huge pages; advice only, so a refusal is ignored."""
    if not sys.platform.startswith("linux") or length <= 0:
        return
    try:
        libc = ctypes.CDLL(None)
        libc.madvise(ctypes.c_void_p(address), ctypes.c_size_t(length), ctypes.c_int(MADV_HUGEPAGE))
    except (OSError, AttributeError):
        pass


def huge_page_bytes(nbytes: int) -> torch.Tensor:
    """`nbytes` new uint8 bytes on the CPU, 2 MiB-aligned and advised for huge pages before anything touches them."""
    raw = torch.empty(nbytes + HUGE_PAGE, dtype=torch.uint8)  # untouched: pages come on the first write
    start = -raw.data_ptr() % HUGE_PAGE
    _advise_huge_pages(raw.data_ptr() + start, nbytes // HUGE_PAGE * HUGE_PAGE)
    return raw[start:start + nbytes]


def zeros(shape, dtype: torch.dtype, device) -> torch.Tensor:
    """torch.zeros, on huge pages on the CPU: the KV cache, whose blocks attention reads scattered over hundreds
    of MB."""
    if torch.device(device).type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    nbytes = torch.Size(shape).numel() * dtype.itemsize
    return huge_page_bytes(nbytes).view(dtype).view(shape).zero_()


def move_into_one_buffer(holders: list, name: str, align: int = 4096) -> int:
    """Copy each holder's tensor attribute `name` into one new buffer (huge_page_bytes), back to back in the
    holders' order, each start `align`-aligned, and point the attribute at its copy, so each original is freed
    as soon as it is copied. Returns the bytes moved. The copies are views of the buffer, which lives as long as
    any of them."""
    sizes = [getattr(h, name).numel() * getattr(h, name).element_size() for h in holders]
    total = sum(cdiv(s, align) * align for s in sizes)
    if total == 0:
        return 0
    buffer, offset = huge_page_bytes(total), 0
    for holder, size in zip(holders, sizes):
        old = getattr(holder, name)
        new = buffer[offset:offset + size].view(old.dtype).view(old.shape)
        new.copy_(old)
        setattr(holder, name, new)
        offset += cdiv(size, align) * align
    return total
