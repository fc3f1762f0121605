"""The shared-memory collectives of tensor-parallel ranks on one machine (csrc/cpu/shm.c, CpuCommunicator).

Worker processes (spawned) form a gloo group, then all-reduce and all-gather the same tensors through shared
memory and through gloo: the shared-memory sum must be the rank-order float32 sum (bf16 rounded once) bit for
bit on every rank, and agree with gloo's (bit for bit at two ranks, where the order cannot matter). Sizes
1, 7 and 1000003 elements, pieces of a segment smaller than the tensor, TP 2 and 3 on this machine's cores, the
build without AVX-512 and without vectorization, a rank killed mid-collective (an error within the timeout,
never a hang), and no /dev/shm entry left. Then the engine: TP=2 runs its collectives through shared memory and
gives TP=1's tokens, and leaves nothing in /dev/shm.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from minivllm import LLM, _C
from minivllm.csrc import build as ops_build
from minivllm.distributed.device_communicators.cpu_communicator import CpuCommunicator, ShmCollectiveError
from minivllm.executor.multiproc_executor import get_open_port

SIZES = (1, 7, 1000003)
SMALL_SLOT = 64 * 1024  # a segment of 2 x ranks x 64 KiB: the 1000003-element tensors go in many pieces


def _inputs(rank: int, numel: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * numel + rank)).to(dtype)


def _compare(world_size: int, rank: int, comm: CpuCommunicator) -> list[str]:
    failures = []
    if torch.float16 not in comm.dtypes:
        failures.append(f"rank {rank}: float16 not served (gcc 12+ has _Float16)")
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for numel in SIZES:
            x = _inputs(rank, numel, dtype)
            expected = _inputs(0, numel, dtype).float()
            for r in range(1, world_size):
                expected += _inputs(r, numel, dtype).float()  # rank order, float32, rounded once below
            shm, gloo = x.clone(), x.clone()
            assert comm.all_reduce(shm) is shm
            dist.all_reduce(gloo)
            case = f"rank {rank} {dtype} numel {numel}"
            if not torch.equal(shm, expected.to(dtype)):
                failures.append(f"{case}: not the rank-order sum")
            if world_size == 2 and not torch.equal(shm, gloo):
                failures.append(f"{case}: not gloo's sum")
            if not torch.allclose(shm.float(), gloo.float(), rtol=1e-2, atol=5e-2):
                failures.append(f"{case}: far from gloo's sum")
            strided = torch.stack([x, x], dim=1)[:, 0]  # not contiguous: reduced through a copy, written back
            comm.all_reduce(strided)
            if not torch.equal(strided, shm):
                failures.append(f"{case}: a strided view reduced differently")
    for shape, dim in (((3, 5), -1), ((4, 1001), 0), ((1,), -1)):
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(rank)).to(torch.bfloat16)
        parts = [torch.empty_like(x) for _ in range(world_size)]
        dist.all_gather(parts, x)
        if not torch.equal(comm.all_gather(x, dim), torch.cat(parts, dim=dim)):
            failures.append(f"rank {rank} all_gather {shape} dim {dim}: not gloo's")
    return failures


def _worker(rank: int, world_size: int, port: int, lib_path: str | None, slot_bytes: int, queue) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        lib = _C.open_library(Path(lib_path)) if lib_path else None
        comm = CpuCommunicator(dist.group.WORLD, list(range(world_size)), rank, lib=lib, slot_bytes=slot_bytes,
                               timeout_s=60)
        assert not comm.disabled
        seen = os.path.exists(f"/dev/shm{comm.name}")
        failures = _compare(world_size, rank, comm)
        comm.destroy()
        if comm.can_serve(torch.ones(1)):
            failures.append(f"rank {rank}: serves after destroy()")
        queue.put((rank, comm.name, seen, failures))
    except BaseException:
        queue.put((rank, None, None, [traceback.format_exc()]))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run(world_size: int, target, *args, timeout: float = 240) -> list[tuple]:
    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), get_open_port()
    procs = [ctx.Process(target=target, args=(r, world_size, port, *args, queue), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    try:
        results = [queue.get(timeout=timeout) for _ in procs]  # bounds a hang
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return sorted(results, key=lambda r: r[0])


@pytest.fixture(scope="module")
def scalar_library(tmp_path_factory) -> str:
    """The library built without AVX-512 and without auto-vectorization: shm.c's plain scalar loops."""
    path = tmp_path_factory.mktemp("scalar") / "ops-scalar.so"
    ops_build.build(path, extra_flags=("-mno-avx512f", "-fno-tree-vectorize"))
    return str(path)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("world_size,slot_bytes,scalar", [(2, SMALL_SLOT, False), (3, SMALL_SLOT, False),
                                                          (3, 1 << 20, False), (2, 4096, True)],
                         ids=["tp2-pieces", "tp3-pieces", "tp3-default-slot", "tp2-scalar"])
def test_shm_collectives_equal_gloo(world_size, slot_bytes, scalar, request):
    lib_path = request.getfixturevalue("scalar_library") if scalar else str(ops_build.ensure_library())
    results = _run(world_size, _worker, lib_path, slot_bytes)
    failures = [f for _, _, _, fs in results for f in fs]
    assert not failures, "\n".join(failures)
    names = {name for _, name, _, _ in results}
    assert len(names) == 1 and all(seen is False for _, _, seen, _ in results), "the name outlived the setup"
    assert not os.path.exists(f"/dev/shm{names.pop()}")


def _dying_worker(rank: int, world_size: int, port: int, queue) -> None:
    try:
        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size,
                                timeout=timedelta(seconds=120))
        comm = CpuCommunicator(dist.group.WORLD, list(range(world_size)), rank, timeout_s=2)
        x = torch.ones(1000)
        comm.all_reduce(x)  # one that works, so the peer dies between two collectives of a live group
        if rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        errors = []
        for _ in range(2):  # the first waits out the timeout, the second fails at once: the group is broken
            try:
                comm.all_reduce(x)
                errors.append(None)
            except ShmCollectiveError as e:
                errors.append(str(e))
        queue.put((rank, comm.name, float(x[0]), errors))
    except BaseException:
        queue.put((rank, None, None, [traceback.format_exc()]))


@pytest.mark.timeout(600)
def test_a_killed_rank_is_an_error_within_the_timeout_and_leaves_no_segment():
    ctx = multiprocessing.get_context("spawn")
    queue, port = ctx.Queue(), get_open_port()
    procs = [ctx.Process(target=_dying_worker, args=(r, 3, port, queue), daemon=True) for r in range(3)]
    for p in procs:
        p.start()
    try:
        results = sorted([queue.get(timeout=240) for _ in range(2)], key=lambda r: r[0])  # the two survivors
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert procs[2].exitcode == -signal.SIGKILL
    for rank, name, value, errors in results:
        assert value == 3.0, errors  # the first all-reduce summed three ones
        assert len(errors) == 2 and "timed out" in errors[0], errors
        assert "MINIVLLM_CPU_SHM_COMM=0" in errors[1] and "Broken pipe" in errors[1], errors
        assert not os.path.exists(f"/dev/shm{name}")


def _group_worker(rank: int, world_size: int, port: int, nnodes: int, queue) -> None:
    try:
        torch.set_num_threads(1)
        from minivllm.distributed import parallel_state as ps
        ps.init_distributed_environment(world_size, rank, f"tcp://127.0.0.1:{port}", rank)
        ps.initialize_model_parallel(world_size, nnodes=nnodes)
        group = ps.get_tp_group()
        communicator = group.device_communicator
        x = torch.full((5,), float(rank + 1), dtype=torch.bfloat16)
        summed, gathered = group.all_reduce(x.clone()), group.all_gather(x.view(1, 5), dim=0)
        half = group.all_reduce(torch.ones(3, dtype=torch.float64))  # a dtype shm.c does not sum: gloo's
        ps.destroy_model_parallel()
        after = group.device_communicator
        ps.destroy_distributed_environment()
        queue.put((rank, communicator is not None, after is None, summed.tolist(), gathered[:, 0].tolist(),
                   half.tolist()))
    except BaseException:
        queue.put((rank, traceback.format_exc(), None, None, None, None))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("nnodes", [1, 2])
def test_the_tp_group_uses_shared_memory_only_on_one_node_and_unmaps_it_at_destroy(nnodes):
    """nnodes 1: GroupCoordinator's all-reduce and all-gather go through CpuCommunicator; nnodes 2 (ranks on
    other machines: the two-"node" launch) keeps gloo. destroy_model_parallel closes the communicator."""
    for rank, used, closed, summed, gathered, half in _run(2, _group_worker, nnodes):
        assert used is (nnodes == 1), used
        assert closed and summed == [3.0] * 5 and gathered == [1.0, 2.0] and half == [2.0] * 3, rank


def _communicator_name(worker) -> str | None:
    from minivllm.distributed.parallel_state import get_tp_group
    communicator = get_tp_group().device_communicator
    return None if communicator is None else communicator.name


@pytest.mark.timeout(600)
def test_the_engine_at_tp2_reduces_through_shared_memory_and_leaves_nothing_in_dev_shm(tiny_llama_folder):
    from test_tensor_parallel import GREEDY, assert_same_as_tp1, greedy_runs
    from conftest import PROMPTS
    tp1 = greedy_runs(str(tiny_llama_folder), multiprocess=False)
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=False)
    try:
        executor = llm.llm_engine.engine_core.engine_core.model_executor
        names = executor.collective_rpc(_communicator_name)
        assert names[0] is not None and names[0] == names[1], names  # both ranks on the one segment
        assert not os.path.exists(f"/dev/shm{names[0]}")  # unlinked once mapped: a killed rank leaves nothing
        outs = llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    finally:
        llm.shutdown()
    assert not os.path.exists(f"/dev/shm{names[0]}")
    assert_same_as_tp1(tp1, [(o.outputs[0].token_ids, [set(s) for s in o.outputs[0].logprobs]) for o in outs], "shm")


def test_the_switch_keeps_gloo(monkeypatch, tiny_llama_folder):
    monkeypatch.setenv("MINIVLLM_CPU_SHM_COMM", "0")
    llm = LLM(str(tiny_llama_folder), tensor_parallel_size=2, multiprocess=False, max_model_len=64)
    try:
        assert llm.llm_engine.engine_core.engine_core.model_executor.collective_rpc(_communicator_name) == [None] * 2
    finally:
        llm.shutdown()
