"""The worker side of MultiprocExecutor: the process of one tensor-parallel rank (vLLM's WorkerProc).

vLLM keeps WorkerProc in multiproc_executor.py; here it is a module of its own, so that each stays short and
the worker's loop reads in one place. `worker_main` is the process's entry: it dies with its parent, takes its
share of the cores, builds a Worker, joins the torch.distributed group (Worker.init_device), tells the executor
READY (rank 0 only), then serves calls until SHUTDOWN. Rank 0 receives each call from the executor's pipe and
broadcasts it; every rank runs it; the answers are gathered to rank 0, which sends them back (for a call with a
`unique_reply_rank`, only that rank answers and nothing is gathered).
"""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys
import traceback
from dataclasses import dataclass

from minivllm import envs
from minivllm.config import EngineConfig

SHUTDOWN = None  # the call that ends every worker's loop


@dataclass
class WorkerFailure:
    """A call that raised in a worker: its rank and traceback, sent back instead of a result."""
    rank: int
    traceback: str


def _die_with_parent(parent_pid: int) -> None:
    """Linux: SIGKILL this worker when the process that started it dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: the executor's shutdown and the daemon flag remain
    if os.getppid() != parent_pid:  # the parent died before the request took effect
        os._exit(1)


def _split_threads(local_rank: int, local_world_size: int) -> None:
    """This rank's share of the cores: threads = cores // local ranks, bound to its own cores if enough."""
    import torch
    if envs.omp_num_threads() is not None:
        return  # the user chose
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count()))
    per_rank = max(1, len(cores) // local_world_size)
    if len(cores) >= local_world_size:
        os.sched_setaffinity(0, cores[local_rank * per_rank:(local_rank + 1) * per_rank])
    torch.set_num_threads(per_rank)


def worker_main(config: EngineConfig, model_folder: str, local_rank: int, rank: int, init_method: str,
                conn, parent_pid: int) -> None:
    """A worker process: join the group, then run calls until the driver broadcasts SHUTDOWN."""
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the caller's to handle
    from minivllm.logger import init_engine_core_logger
    init_engine_core_logger(f"VllmWorker rank={rank}")
    _split_threads(local_rank, config.local_world_size)
    from minivllm.distributed.parallel_state import get_world_group
    from minivllm.worker.gpu_worker import Worker
    worker = Worker(config, model_folder, local_rank, rank, init_method, is_driver_worker=rank == 0)
    try:
        worker.init_device()
    except BaseException:
        if conn is not None:
            conn.send(WorkerFailure(rank, traceback.format_exc()))
        raise
    if conn is not None:
        conn.send("READY")
    world = get_world_group()
    while True:
        call = conn.recv() if conn is not None else None
        method, args, kwargs, unique_reply_rank = world.broadcast_object(call, src=0)
        if method is SHUTDOWN:
            break
        try:
            fn = getattr(worker, method) if isinstance(method, str) else (lambda *a, **k: method(worker, *a, **k))
            result = fn(*args, **kwargs)
        except Exception:
            if unique_reply_rank is not None and rank != unique_reply_rank:
                raise  # nobody reads this rank's reply: dying is how it reports (the executor sees it)
            result = WorkerFailure(rank, traceback.format_exc())
        if unique_reply_rank is None:
            result = world.gather_object(result, dst=0)
        elif rank != unique_reply_rank:
            continue
        if conn is not None:
            conn.send(result)
    worker.shutdown()
    _exit_without_teardown()


def _exit_without_teardown() -> None:
    """End the process once the worker has released what it holds (its group, its shared-memory segment), without
    the interpreter's teardown: all that would add is third-party noise on stderr (transformers' config classes
    import torch._dynamo and so Triton, whose bindings report "nanobind: leaked ..." at every teardown), printed
    into the caller's terminal or notebook each time an engine with tensor parallelism shuts down."""
    logging.shutdown()  # flush the log handlers, as the teardown would
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)
