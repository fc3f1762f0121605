"""Mirror of vllm/v1/executor/multiproc_executor.py: MultiprocExecutor, one worker process per rank.

EngineCore's Executor starts `tensor_parallel_size / nnodes` WorkerProc processes on this machine (spawned,
never forked). Each builds a Worker, joins the torch.distributed group of all ranks (gloo on the CPU, NCCL
on GPUs; rank 0 hosts the TCP store at `distributed_init_method`), and then waits for calls.

How a call travels (vLLM broadcasts each call once through a shared-memory MessageQueue that every
worker reads; minivllm uses a pipe and the process group the workers already share):

  EngineCore --pipe--> rank 0 --broadcast_object_list (gloo)--> ranks 1..tp-1
  every rank runs the method on its shard (the model's own all-reduces happen inside)
  rank 0 <--gather_object (gloo)-- every rank's result      (skipped for execute_model: only the
  EngineCore <--pipe-- rank 0                                 driver's output is wanted, vLLM's
                                                              unique_reply_rank)

so only rank 0 talks to EngineCore, and ranks on other machines (`--headless` launches) need nothing
but the process group. The executor waits on the pipe and on every local worker's process sentinel
together, so a worker that dies turns into EngineDeadError within a moment, never a hang; then the
other workers are stopped. Workers are daemonic and ask the kernel to kill them when their parent
dies (PR_SET_PDEATHSIG), so none outlives EngineCore, even one killed with SIGKILL.

OpenMP threads are split between the ranks on one machine (vLLM's VLLM_CPU_OMP_THREADS_BIND="auto"):
each rank takes cores // local ranks threads, bound to its own cores where there are enough, unless
OMP_NUM_THREADS was set. A call is pickled by reference: a function passed to collective_rpc must be
importable (module level), not a lambda (vLLM uses cloudpickle). Left out: the shared-memory message
queue, non-blocking execute_model futures, pipeline parallel ranks, Ray, worker death callbacks.
"""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import socket
import traceback
import weakref
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any, Callable

from minivllm.config import EngineConfig
from minivllm.engine.exceptions import EngineDeadError
from minivllm.engine.utils import child_setup
from minivllm.executor.abstract import Executor
from minivllm.outputs import ModelRunnerOutput

SHUTDOWN = None  # the call that ends every worker's loop


@dataclass
class WorkerFailure:
    """A call that raised in a worker: its rank and traceback, sent back instead of a result."""
    rank: int
    traceback: str


def get_open_port() -> int:
    """A free TCP port on this machine for a one-machine group's store (vLLM's get_open_port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def distributed_init_method(config: EngineConfig) -> str:
    """Where the ranks meet: master_addr:master_port across machines, a free local port on one machine."""
    if config.nnodes > 1:
        return f"tcp://{config.master_addr}:{config.master_port}"
    return f"tcp://127.0.0.1:{get_open_port()}"


class MultiprocExecutor(Executor):
    def _init_executor(self) -> None:
        config = self.config
        init_method = distributed_init_method(config)
        # EngineCore's own process may be daemonic (minivllm starts it so); a daemonic process may not
        # start children, and these workers are its children by design (they die with it).
        multiprocessing.current_process().daemon = False
        self.workers: list[multiprocessing.Process] = []
        self.driver_conn = None
        try:
            self.workers, self.driver_conn = start_workers(config, self.model_folder, init_method)
            self._finalizer = weakref.finalize(self, stop_workers, self.workers, self.driver_conn)
            self._receive()  # rank 0 is READY once every rank has joined the group
            self.collective_rpc("load_model")
        except BaseException:
            stop_workers(self.workers, self.driver_conn)
            raise

    def _receive(self) -> Any:
        """The driver's next reply; a worker process that dies meanwhile raises EngineDeadError."""
        sentinels = {w.sentinel: w for w in self.workers}
        while True:
            ready = wait([self.driver_conn, *sentinels])
            if self.driver_conn in ready:
                try:
                    reply = self.driver_conn.recv()
                except (EOFError, OSError):
                    raise self._dead(self.workers[0]) from None
                if isinstance(reply, WorkerFailure):
                    raise self._failed(f"the worker of rank {reply.rank} raised:\n{reply.traceback}")
                if isinstance(reply, list) and (failure := next((r for r in reply if isinstance(r, WorkerFailure)),
                                                                None)):
                    raise self._failed(f"the worker of rank {failure.rank} raised:\n{failure.traceback}")
                return reply
            raise self._dead(sentinels[ready[0]])

    def _failed(self, why: str) -> EngineDeadError:
        self.is_failed = True
        stop_workers(self.workers, None)  # no polite SHUTDOWN: a rank may be stuck waiting for the dead one
        self.shutdown()
        return EngineDeadError(f"Tensor-parallel worker failed: {why}")

    def _dead(self, worker: multiprocessing.Process) -> EngineDeadError:
        worker.join(timeout=1)
        return self._failed(f"worker process {worker.name} (pid={worker.pid}) died with exit code "
                            f"{worker.exitcode}; the other ranks were stopped. Create a new LLM to continue.")

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
                       unique_reply_rank: int | None = None) -> list[Any]:
        """Run `method` on every rank; one result per rank (or, with unique_reply_rank=0, the driver's only)."""
        if self.is_failed or self.driver_conn is None:
            raise EngineDeadError("The tensor-parallel workers are gone (a worker failed, or the executor was "
                                  "shut down). Create a new LLM to continue.")
        try:
            self.driver_conn.send((method, args, kwargs or {}, unique_reply_rank))
        except (BrokenPipeError, OSError):
            raise self._dead(self.workers[0]) from None
        reply = self._receive()
        return [reply] if unique_reply_rank is not None else reply

    def execute_model(self, scheduler_output) -> ModelRunnerOutput:
        return self.collective_rpc("execute_model", args=(scheduler_output,), unique_reply_rank=0)[0]

    def check_health(self) -> None:
        for worker in self.workers:
            if not worker.is_alive():
                raise self._dead(worker)
        self.collective_rpc("check_health")

    def shutdown(self) -> None:
        if getattr(self, "_finalizer", None) is not None:
            self._finalizer()
        self.driver_conn = None


def start_workers(config: EngineConfig, model_folder: str, init_method: str, with_driver: bool = True):
    """Spawn this machine's ranks; returns (processes, the pipe to rank 0 or None on a headless node)."""
    ctx = multiprocessing.get_context("spawn")
    local = config.local_world_size
    driver_conn = child_conn = None
    if with_driver:
        driver_conn, child_conn = ctx.Pipe(duplex=True)
    workers = []
    with child_setup():
        for local_rank in range(local):
            rank = config.node_rank * local + local_rank
            process = ctx.Process(target=worker_main, name=f"VllmWorker-{rank}", daemon=True,
                                  args=(config, str(model_folder), local_rank, rank, init_method,
                                        child_conn if rank == 0 else None, os.getpid()))
            process.start()
            workers.append(process)
    if child_conn is not None:
        child_conn.close()  # only rank 0 holds it now: its death ends our reads with EOF
    return workers, driver_conn


def stop_workers(workers: list, driver_conn) -> None:
    """With the pipe to rank 0: ask it to end every rank's loop and give them 5 s. Then kill whoever is left."""
    if driver_conn is not None:
        try:
            driver_conn.send((SHUTDOWN, (), {}, None))
        except (OSError, ValueError):
            pass
        for worker in workers:
            worker.join(timeout=5)
    for worker in workers:
        if worker.is_alive():
            worker.kill()
            worker.join(timeout=5)
    if driver_conn is not None:
        driver_conn.close()


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
    if "OMP_NUM_THREADS" in os.environ:
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


def run_headless(config: EngineConfig, model_folder: str) -> int:
    """`--headless`: run this machine's ranks only (node_rank > 0); they take their calls from rank 0 on
    node 0 and end when it ends. Returns the first non-zero exit code, or 0."""
    workers, _ = start_workers(config, model_folder, distributed_init_method(config), with_driver=False)
    try:
        for worker in workers:
            worker.join()
    finally:
        stop_workers(workers, None)
    return next((w.exitcode for w in workers if w.exitcode), 0)
