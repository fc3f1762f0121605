"""Mirror of vllm/v1/executor/multiproc_executor.py: MultiprocExecutor, one worker process per rank.

EngineCore's Executor starts `tensor_parallel_size / nnodes` worker processes on this machine (spawned,
never forked; their side is multiproc_worker.py). Each builds a Worker, joins the torch.distributed group
of all ranks (gloo on the CPU, NCCL on GPUs; rank 0 hosts the TCP store at `distributed_init_method`), and
then waits for calls.

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
importable (module level), not a lambda (vLLM uses cloudpickle). A non-blocking call (async scheduling's
execute_model) is sent at once and its reply read only when its result is asked for (or before any later
call's), replies in the order of the calls, as vLLM's futures queue. Left out: the shared-memory message queue,
pipeline parallel ranks, Ray, worker death callbacks.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import socket
import weakref
from collections import deque
from multiprocessing.connection import wait
from typing import Any, Callable

from minivllm.config import EngineConfig
from minivllm.engine.exceptions import EngineDeadError, log_traceback
from minivllm.engine.utils import child_setup
from minivllm.executor.abstract import Executor
from minivllm.executor.multiproc_worker import SHUTDOWN, WorkerFailure, worker_main

logger = logging.getLogger("minivllm")

# vLLM's VLLM_EXECUTE_MODEL_TIMEOUT_SECONDS default: a step that takes longer means a rank is stuck (alive but
# never answering, e.g. waiting in a collective for a peer that hangs); the engine is then declared dead.
EXECUTE_MODEL_TIMEOUT_S = 300


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


class PendingReply:
    """A call sent to the ranks whose reply is still in the pipe: result() reads the replies up to its own."""

    def __init__(self, executor: "MultiprocExecutor", unique_reply_rank: int | None, timeout: float | None) -> None:
        self.executor, self.unique_reply_rank, self.timeout = executor, unique_reply_rank, timeout
        self._done, self._value, self._error = False, None, None

    def done(self) -> bool:
        return self._done

    def result(self) -> list[Any]:
        while not self._done:
            self.executor._receive_pending()
        if self._error is not None:
            raise self._error
        return self._value

    def _settle(self) -> None:
        try:
            reply = self.executor._receive(self.timeout)
            self._value = [reply] if self.unique_reply_rank is not None else reply
        except BaseException as e:  # the step's failure is raised by result(), where the caller asks for it
            self._error = e
        self._done = True


class MultiprocExecutor(Executor):
    execute_model_timeout = EXECUTE_MODEL_TIMEOUT_S

    def _init_executor(self) -> None:
        self._pending: deque[PendingReply] = deque()  # sent, reply not read yet; oldest first
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

    def _receive(self, timeout: float | None = None) -> Any:
        """The driver's next reply; a worker process that dies meanwhile, or no reply within `timeout`
        seconds, raises EngineDeadError."""
        sentinels = {w.sentinel: w for w in self.workers}
        while True:
            ready = wait([self.driver_conn, *sentinels], timeout)
            if not ready:
                raise self._failed(f"no reply from rank 0 within {timeout} s (a rank is stuck); the ranks were "
                                   f"stopped. Create a new LLM to continue.")
            if self.driver_conn in ready:
                try:
                    reply = self.driver_conn.recv()
                except (EOFError, OSError):
                    raise self._dead(self.workers[0]) from None
                if isinstance(reply, WorkerFailure):
                    raise self._failed(f"the worker of rank {reply.rank} raised "
                                      f"{log_traceback(f'rank {reply.rank}', reply.traceback)}")
                if isinstance(reply, list) and (failure := next((r for r in reply if isinstance(r, WorkerFailure)),
                                                                None)):
                    raise self._failed(f"the worker of rank {failure.rank} raised "
                                      f"{log_traceback(f'rank {failure.rank}', failure.traceback)}")
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

    def _receive_pending(self) -> None:
        self._pending.popleft()._settle()

    def collective_rpc(self, method: str | Callable, args: tuple = (), kwargs: dict | None = None,
                       unique_reply_rank: int | None = None, timeout: float | None = None,
                       non_block: bool = False):
        """Run `method` on every rank; one result per rank (or, with unique_reply_rank=0, the driver's only).
        `timeout`: seconds to wait for the reply (None: as long as it takes, e.g. loading the model)."""
        while self._pending and not non_block:  # replies come in call order: the calls in flight first
            self._receive_pending()
        if self.is_failed or self.driver_conn is None:
            raise EngineDeadError("The tensor-parallel workers are gone (a worker failed, or the executor was "
                                  "shut down). Create a new LLM to continue.")
        try:
            self.driver_conn.send((method, args, kwargs or {}, unique_reply_rank))
        except (BrokenPipeError, OSError):
            raise self._dead(self.workers[0]) from None
        if non_block:
            self._pending.append(PendingReply(self, unique_reply_rank, timeout))
            return self._pending[-1]
        reply = self._receive(timeout)
        return [reply] if unique_reply_rank is not None else reply

    def check_health(self) -> None:
        """Raise EngineDeadError if a local worker process is gone (no call to the ranks: EngineCore's busy
        loop asks this every idle second, so a worker that dies while nothing runs is noticed too)."""
        for worker in self.workers:
            if not worker.is_alive():
                raise self._dead(worker)

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


def run_headless(config: EngineConfig) -> int:
    """`serve --headless` (vLLM's multi-node multiprocessing launch): this node's ranks only, no EngineCore and
    no server; they take every call from rank 0 on node 0 and end when it ends. Returns their exit status."""
    from minivllm.engine.processor import resolve_engine_config
    if config.node_rank == 0 or config.nnodes < 2:
        raise ValueError(f"--headless runs the workers of a node after the first: give --nnodes >= 2 and "
                         f"--node-rank >= 1 (got --nnodes {config.nnodes} --node-rank {config.node_rank}); "
                         f"node 0 runs the server itself, without --headless.")
    config, model_folder, _ = resolve_engine_config(config)  # the same resolved dtype and sizes as node 0's
    logger.info("headless node %d of %d: ranks %d-%d wait for rank 0 at %s:%d", config.node_rank, config.nnodes,
                config.node_rank * config.local_world_size, (config.node_rank + 1) * config.local_world_size - 1,
                config.master_addr, config.master_port)
    workers, _ = start_workers(config, str(model_folder), distributed_init_method(config), with_driver=False)
    try:
        for worker in workers:
            worker.join()
    finally:
        stop_workers(workers, None)
    return next((w.exitcode for w in workers if w.exitcode), 0)
