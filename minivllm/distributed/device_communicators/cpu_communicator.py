"""Mirror of vllm/distributed/device_communicators/cpu_communicator.py: the CPU's collectives through shared memory.

Over gloo one all-reduce is a round of TCP messages through the kernel's loopback, a cost paid dozens of times a
step (each RowParallelLinear, the embedding). Ranks on one machine can instead meet in memory they all map: vLLM's
CpuCommunicator does so with csrc/cpu/shm.cpp, minivllm's with csrc/cpu/shm.c (the layout, the barrier and the
pieces are described there). gloo still forms the group, carries the setup and everything else (objects,
gather), and remains the path across machines.

Setup, collective over the group's gloo `cpu_group`: rank 0 picks a name no other launch can hold (its pid and a
random token), creates the segment, then broadcasts the name; every rank maps it and reports; once all have
reported, rank 0 unlinks the name, before any rank returns. From then on nothing of the segment is visible in
/dev/shm, and its memory is freed by the kernel when the last rank unmaps it or dies, however it dies. Where any
rank fails to map it, every rank logs why and keeps gloo. A collective that waits longer than `timeout_s` for a
peer (dead or stuck) raises instead of hanging, and every later one raises too.

Differs from vLLM: vLLM keys the segment by VLLM_DIST_IDENT and gives each rank a segment of its own;
here one per group, named at setup. float32, bfloat16 and float16 (where the C compiler has _Float16) are
summed in float32 and rounded once; other dtypes go through gloo.
"""
from __future__ import annotations

import ctypes
import logging
import os
import secrets

import torch
import torch.distributed as dist

from minivllm import _C

logger = logging.getLogger("minivllm")

SLOT_BYTES = 1 << 20  # one rank's piece of a collective; larger tensors go in several pieces
TIMEOUT_S = 300.0  # as the executor's step timeout: a peer this late is dead or stuck
_DTYPES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # cpu_types.h's DTYPE_F32, DTYPE_BF16; shm.c's


class ShmCollectiveError(RuntimeError):
    """A shared-memory collective failed: a peer did not arrive in time (dead or stuck), or the group is closed."""


class CpuCommunicator:
    """All-reduce and all-gather for the ranks of one group on this machine, through one shared-memory segment.

    `cpu_group` is the group's gloo group (setup only), `ranks` its global ranks, `rank_in_group` this rank's
    index. `lib` is the compiled library (default: minivllm's, `_C.load()`). Check `disabled` after building:
    True where the segment could not be had on some rank, and then the caller keeps gloo."""

    def __init__(self, cpu_group, ranks: list[int], rank_in_group: int, lib: ctypes.CDLL | None = None,
                 slot_bytes: int = SLOT_BYTES, timeout_s: float = TIMEOUT_S) -> None:
        if slot_bytes < 64 or slot_bytes % 64 or timeout_s <= 0:
            raise ValueError(f"slot_bytes must be a positive multiple of 64 and timeout_s positive, got {slot_bytes} "
                             f"and {timeout_s} (the defaults: {SLOT_BYTES}, {TIMEOUT_S})")
        self.world_size, self.rank_in_group = len(ranks), rank_in_group
        self.lib = lib if lib is not None else _C.load()
        self.name: str | None = None
        self._handle = None
        if self.lib is not None:
            self._handle = ctypes.create_string_buffer(self.lib.shm_handle_size())
        timeout_ms, rc = int(timeout_s * 1000), 0
        if rank_in_group == 0:  # create first, then name it: the others open it only once it exists
            self.name = f"/minivllm-{os.getpid()}-{secrets.token_hex(8)}"
            rc = self._open(slot_bytes, timeout_ms)
        box = [(self.name, rc)]
        dist.broadcast_object_list(box, src=ranks[0], group=cpu_group)
        self.name, created = box[0]
        if rank_in_group != 0 and created == 0:
            rc = self._open(slot_bytes, timeout_ms)
        codes = [None] * self.world_size
        dist.all_gather_object(codes, rc, group=cpu_group)  # every rank has tried: the name may go
        if rank_in_group == 0 and rc == 0:
            self.lib.shm_group_unlink(self._handle)
        dist.barrier(group=cpu_group)  # the name is gone on every rank's return
        self.disabled = any(codes)
        self.dtypes = [] if self.disabled else [d for d, code in _DTYPES.items()  # float16 where the compiler has it
                                                if self.lib.shm_all_reduce(self._handle, None, 0, code) == 0]
        if self.disabled:
            failed = {r: os.strerror(-c) for r, c in enumerate(codes) if c}
            logger.warning("shared-memory collectives unavailable (%s), using gloo instead", failed)
            self.destroy()

    def _open(self, slot_bytes: int, timeout_ms: int) -> int:
        if self._handle is None:
            return -38  # ENOSYS: no compiled library on this rank
        return self.lib.shm_group_open(self._handle, self.name.encode(), self.rank_in_group, self.world_size,
                                       slot_bytes, timeout_ms)

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise ShmCollectiveError(
                f"shared-memory {what} failed on rank {self.rank_in_group}: {os.strerror(-rc)} (a peer rank died or "
                f"is stuck, or the group was closed); the collectives of this group are over. Start a new engine, "
                f"or set MINIVLLM_CPU_SHM_COMM=0 to use gloo")

    def can_serve(self, input_: torch.Tensor) -> bool:
        """True for a CPU tensor of a dtype shm.c sums (the same answer on every rank for the same call)."""
        return self._handle is not None and input_.dtype in self.dtypes and input_.device.type == "cpu"

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """Sum over the group, in place (vLLM's returns a new tensor; the callers here use either)."""
        data = input_ if input_.is_contiguous() else input_.contiguous()
        self._check(self.lib.shm_all_reduce(self._handle, data.data_ptr(), data.numel(), _DTYPES[data.dtype]),
                    "all-reduce")
        if data is not input_:
            input_.copy_(data)
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `input_` (one shape on all ranks) concatenated along `dim`."""
        data = input_.contiguous()
        out = torch.empty((self.world_size, *data.shape), dtype=data.dtype)
        self._check(self.lib.shm_all_gather(self._handle, data.data_ptr(), out.data_ptr(),
                                            data.numel() * data.element_size()), "all-gather")
        return torch.cat(out.unbind(0), dim=dim)

    def destroy(self) -> None:
        """Unmap the segment (idempotent): the group then goes back to gloo; a call on a broken one raises."""
        if self._handle is not None:
            self.lib.shm_group_close(self._handle)
            self._handle = None
