"""Mirror of vllm/distributed/parallel_state.py: the process groups a worker joins, and the one it computes in.

Each worker process calls `init_distributed_environment(world_size, rank, "tcp://host:port", local_rank)`
once (torch.distributed's TCP store is the rendezvous, on one machine or several), then
`initialize_model_parallel(tensor_model_parallel_size)`; from then on a layer asks `get_tp_group()`
for its rank, the group's size and the collectives. A GroupCoordinator holds two groups over the same
ranks, as vLLM's: `device_group` for tensors (gloo on the CPU, NCCL where the tensors live on CUDA) and
`cpu_group` (always gloo) for Python objects such as the SchedulerOutput the driver broadcasts.

With tensor_parallel_size 1 no process group is created at all: `get_tp_group()` is a group of one whose
collectives return their input (vLLM creates a one-rank group even then; minivllm skips the TCP store,
so a single-process engine needs no free port). The tensor-parallel group of ranks on one machine (nnodes == 1)
gets vLLM's device communicator for the CPU, CpuCommunicator (device_communicators/cpu_communicator.py): its
all-reduce and all-gather of float32/bfloat16/float16 go through shared memory, the rest through gloo, and all
of it through gloo across machines or with MINIVLLM_CPU_SHM_COMM=0. Left out: pipeline, data, expert and
context parallel groups, custom all-reduce kernels for GPUs, shared-memory broadcasters.

Tracing records the collectives from outside (minivllm/tracing/collectives.py wraps this object's methods while
a trace is open); nothing here knows of it.
"""
from __future__ import annotations

from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

# How long a rank waits for the others to join (init_process_group): nodes started minutes apart still meet.
DIST_TIMEOUT = timedelta(seconds=300)
# A group's collectives time out after this. Ranks 1..tp-1 wait for the next call inside a broadcast, for as
# long as the engine sits idle, so the groups get no practical limit (gloo's default, 30 min, would kill an
# idle server). A peer that dies is seen at once anyway: its connection closes ("Connection closed by peer").
GROUP_TIMEOUT = timedelta(days=365)


class GroupCoordinator:
    """One group of ranks: who am I in it, how many are we, and the collectives over it."""

    def __init__(self, ranks: list[int], backend: str | None) -> None:
        self.ranks = list(ranks)
        self.world_size, self.backend = len(self.ranks), backend
        self.device_communicator = None  # set by init_device_communicator; None: torch.distributed's collectives
        if self.world_size == 1 or backend is None:
            self.rank, self.rank_in_group, self.device_group, self.cpu_group = self.ranks[0], 0, None, None
        else:
            self.rank = dist.get_rank()
            self.rank_in_group = self.ranks.index(self.rank)
            self.device_group = dist.new_group(self.ranks, backend=backend, timeout=GROUP_TIMEOUT)
            self.cpu_group = self.device_group if backend == "gloo" else \
                dist.new_group(self.ranks, backend="gloo", timeout=GROUP_TIMEOUT)
        self.is_first_rank = self.rank_in_group == 0

    def init_device_communicator(self) -> None:
        """The shared-memory collectives, for a CPU group whose ranks are all on this machine (collective: every
        rank of the group calls it). vLLM builds its communicator in __init__; here the caller knows the nodes."""
        from minivllm import envs
        if (self.world_size == 1 or self.backend != "gloo" or not envs.cpu_shm_comm()
                or self.device_communicator is not None):
            return
        from minivllm.distributed.device_communicators.cpu_communicator import CpuCommunicator
        communicator = CpuCommunicator(self.cpu_group, self.ranks, self.rank_in_group)
        self.device_communicator = None if communicator.disabled else communicator

    def destroy_device_communicator(self) -> None:
        if self.device_communicator is not None:
            self.device_communicator.destroy()
            self.device_communicator = None

    def all_reduce(self, input_: torch.Tensor) -> torch.Tensor:
        """Sum `input_` over the group, in place; every rank gets the sum."""
        if self.world_size == 1:
            return input_
        if self.device_communicator is not None and self.device_communicator.can_serve(input_):
            return self.device_communicator.all_reduce(input_)
        dist.all_reduce(input_, group=self.device_group)
        return input_

    def all_gather(self, input_: torch.Tensor, dim: int = -1) -> torch.Tensor:
        """Every rank's `input_` concatenated along `dim`, on every rank."""
        if self.world_size == 1:
            return input_
        if self.device_communicator is not None and self.device_communicator.can_serve(input_):
            return self.device_communicator.all_gather(input_, dim)
        parts = [torch.empty_like(input_) for _ in range(self.world_size)]
        dist.all_gather(parts, input_.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)

    def gather(self, input_: torch.Tensor, dst: int = 0, dim: int = -1) -> torch.Tensor | None:
        """Every rank's `input_` concatenated along `dim` on rank `dst` of the group; None elsewhere."""
        if self.world_size == 1:
            return input_
        is_dst = self.rank_in_group == dst
        parts = [torch.empty_like(input_) for _ in range(self.world_size)] if is_dst else None
        dist.gather(input_.contiguous(), parts, dst=self.ranks[dst], group=self.device_group)
        return torch.cat(parts, dim=dim) if is_dst else None

    def broadcast_object(self, obj: Any = None, src: int = 0) -> Any:
        """Rank `src`'s Python object on every rank (pickled, over the gloo group)."""
        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, src=self.ranks[src], group=self.cpu_group)
        return box[0]

    def gather_object(self, obj: Any, dst: int = 0) -> list[Any] | None:
        """Every rank's object, in rank order, on rank `dst`; None elsewhere."""
        if self.world_size == 1:
            return [obj]
        out = [None] * self.world_size if self.rank_in_group == dst else None
        dist.gather_object(obj, out, dst=self.ranks[dst], group=self.cpu_group)
        return out


_WORLD: GroupCoordinator | None = None
_TP: GroupCoordinator | None = None


def init_distributed_environment(world_size: int = 1, rank: int = 0, distributed_init_method: str = "env://",
                                 local_rank: int = 0, backend: str = "gloo") -> None:
    """Join the world of `world_size` ranks (a no-op for a world of one). Every rank calls this with the same
    `distributed_init_method` ("tcp://master_addr:master_port"); rank 0 hosts the TCP store."""
    global _WORLD
    if _WORLD is not None:
        if _WORLD.world_size != world_size:
            raise RuntimeError(f"this process already joined a world of {_WORLD.world_size}, not {world_size}")
        return
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(backend, init_method=distributed_init_method, world_size=world_size, rank=rank,
                                timeout=DIST_TIMEOUT)
    _WORLD = GroupCoordinator(list(range(world_size)), backend if world_size > 1 else None)
    _WORLD.rank, _WORLD.local_rank = rank, local_rank


def initialize_model_parallel(tensor_model_parallel_size: int = 1, nnodes: int = 1) -> None:
    """Split the world into tensor-parallel groups. Pipeline and data parallelism are left out, so the
    world is exactly one tensor-parallel group and the TP group is the world's own (vLLM makes a second).
    With every rank on this machine (`nnodes` 1; vLLM reads it from its config) the group's all-reduce and
    all-gather go through shared memory (GroupCoordinator.init_device_communicator)."""
    global _TP
    if _WORLD is None:
        raise RuntimeError("init_distributed_environment() must run before initialize_model_parallel()")
    if _WORLD.world_size != tensor_model_parallel_size:
        raise ValueError(f"world size {_WORLD.world_size} != tensor_model_parallel_size "
                         f"{tensor_model_parallel_size}: minivllm has no other parallel dimension")
    _TP = _WORLD
    if nnodes == 1:
        _TP.init_device_communicator()


def model_parallel_is_initialized() -> bool:
    return _TP is not None


_SINGLE = GroupCoordinator([0], None)  # what a model built outside any worker (a test, a notebook) computes in


def get_tp_group() -> GroupCoordinator:
    return _TP if _TP is not None else _SINGLE


def get_world_group() -> GroupCoordinator:
    return _WORLD if _WORLD is not None else _SINGLE


def get_tensor_model_parallel_world_size() -> int:
    return get_tp_group().world_size


def get_tensor_model_parallel_rank() -> int:
    return get_tp_group().rank_in_group


def destroy_model_parallel() -> None:
    """Leave the tensor-parallel group: its shared-memory segment is unmapped here."""
    global _TP
    if _TP is not None:
        _TP.destroy_device_communicator()
    _TP = None


def destroy_distributed_environment() -> None:
    """Leave the world this process joined (a world of one joined nothing: the caller's own groups stay)."""
    global _WORLD
    if _WORLD is not None:
        _WORLD.destroy_device_communicator()
    if _WORLD is not None and _WORLD.world_size > 1 and dist.is_initialized():
        dist.destroy_process_group()
    _WORLD = None
