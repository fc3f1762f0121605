"""Mirror of vllm/v1/worker/gpu_worker.py: the Worker, which owns one device, its model and its KV cache.

An Executor drives one Worker per rank through the same few calls, in vLLM's order: `init_device`
(seed this process, pick the device), `load_model` (read the weights, build the GPUModelRunner),
`determine_available_memory` (what is left for the KV cache once the weights are in), then
`initialize_from_config` (allocate the pool EngineCore sized), `compile_or_warm_up_model` (capture the
CPU graphs of decode batches, where vLLM captures CUDA graphs), and every step `execute_model`.
The packing and the forward live in the runner; the worker only owns what a process holds.
Under tensor parallelism (one Worker per process, started by MultiprocExecutor) `init_device` also
joins the torch.distributed group of all ranks, so the model's layers are built as this rank's shard.
Left out: WorkerWrapperBase (the executor holds the Worker itself), sleep mode, LoRA, torch.compile
and warm-up runs.
"""
from __future__ import annotations

import ctypes
import random

import numpy as np
import torch

from minivllm import envs
from minivllm.attention.selector import get_attn_backend_name
from minivllm.config import EngineConfig
from minivllm.core.kv_cache_utils import KVCacheConfig, max_model_len_for, requested_kv_cache_bytes
from minivllm.core.sched.output import SchedulerOutput
from minivllm.distributed.parallel_state import (destroy_distributed_environment, destroy_model_parallel,
                                                 init_distributed_environment, initialize_model_parallel)
from minivllm.models.loader import get_model, load_config
from minivllm.outputs import ModelRunnerOutput
from minivllm.utils.gc_utils import freeze_gc_heap
from minivllm.worker.gpu_model_runner import GPUModelRunner

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def keep_freed_memory() -> None:
    """CPU: stop glibc from returning big freed buffers to the OS after every step.

    By default each allocation over 32 MiB is its own mmap, unmapped on free, so every step
    page-faults its large activations in again, which slows the large GEMMs.
    Serving everything from the heap and never trimming it makes a step reuse last step's memory.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return  # not glibc: nothing to tune
    libc.mallopt(-4, 0)  # M_MMAP_MAX: no mmap-backed chunks
    libc.mallopt(-1, 2**31 - 1)  # M_TRIM_THRESHOLD: never give the heap top back


def set_random_seed(seed: int) -> None:
    """As vLLM's worker: seed Python's, NumPy's and torch's global generators in this process.

    In-process (MINIVLLM_ENABLE_V1_MULTIPROCESSING=0) that process is the caller's, so a script's own
    `random` calls after LLM(seed=...) repeat run to run, as vLLM's reproducibility example expects.
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class Worker:
    def __init__(self, config: EngineConfig, model_folder: str, local_rank: int = 0, rank: int = 0,
                 distributed_init_method: str | None = None, is_driver_worker: bool = True) -> None:
        self.config, self.model_folder = config, model_folder
        self.local_rank, self.rank, self.is_driver_worker = local_rank, rank, is_driver_worker
        self.distributed_init_method = distributed_init_method  # "tcp://master_addr:master_port"
        self.model_runner: GPUModelRunner | None = None

    def init_device(self) -> None:
        """Pick the device, join the tensor-parallel group, seed this process (every rank alike, so that
        each samples the same tokens from the same logits)."""
        config = self.config
        if config.device == "cpu" and envs.keep_freed_memory():
            keep_freed_memory()
        if config.device == "cuda" and config.tensor_parallel_size > 1:
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device(config.device)
        tp = config.tensor_parallel_size
        init_distributed_environment(tp, self.rank, self.distributed_init_method or "env://", self.local_rank,
                                     backend="nccl" if config.device == "cuda" else "gloo")
        initialize_model_parallel(tp, config.nnodes)
        set_random_seed(config.seed)

    def load_model(self) -> None:
        config = self.config
        hf_config = load_config(self.model_folder)
        max_model_len = max_model_len_for(config, hf_config)
        model = get_model(self.model_folder, hf_config, max_model_len, _DTYPES[config.dtype], self.device)
        self.model_runner = GPUModelRunner(
            model, block_size=config.block_size, max_num_reqs=config.max_num_seqs, max_model_len=max_model_len,
            attention_backend=get_attn_backend_name(config.attention_backend, config.device, config.dtype),
            device=self.device, seed=config.seed, speculative_config=config.spec_config,
            enforce_eager=config.enforce_eager)

    def determine_available_memory(self) -> int:
        """Bytes this worker's KV cache may take, measured now that the weights are in memory."""
        return requested_kv_cache_bytes(self.config)

    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        """Allocate the KV cache EngineCore sized (the same number of blocks on every rank)."""
        self.model_runner.initialize_kv_cache(kv_cache_config.num_blocks)

    def compile_or_warm_up_model(self) -> None:
        """vLLM's: with the KV cache in place, capture the graphs. Here the CPU graphs of decode batches
        (minivllm/compilation/cpu_graph.py); nothing is compiled. Then, as vLLM's, freeze this process's heap
        (utils/gc_utils.py)."""
        self.model_runner.capture_model()
        freeze_gc_heap()

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput:
        return self.model_runner.execute_model(scheduler_output)

    def take_draft_token_ids(self):
        return self.model_runner.take_draft_token_ids()

    def get_model(self) -> torch.nn.Module:
        return self.model_runner.get_model()

    def check_health(self) -> None:
        return  # answering at all is the health: the executor notices a worker process that is gone

    def shutdown(self) -> None:
        self.model_runner = None
        destroy_model_parallel()
        destroy_distributed_environment()
