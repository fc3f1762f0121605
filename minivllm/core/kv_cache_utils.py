"""Mirror of vllm/v1/core/kv_cache_utils.py: block hashes for prefix caching, and the KV cache's size.

Block hashes: a full block is named by a hash of its parent block's hash and its own token ids, so one
hash stands for the whole prefix up to the block's end (`hash_block_tokens`, seeded by `NONE_HASH` for
the first block). `get_request_block_hasher` gives a Request the function that hashes each block its
tokens fill. Sizes: `get_kv_cache_config` turns the engine arguments, the model's config and the
memory the workers report into one KVCacheConfig, and refuses, naming the argument, a size the machine
cannot hold; `resolve_sizes` runs the same check in the caller before anything loads. vLLM profiles a
forward pass on the GPU to find what is left for the cache; minivllm reads the free memory instead
(`requested_kv_cache_bytes`). Left out: extra hash keys (LoRA ids, multimodal hashes, cache_salt),
a choice of hash function, hybrid/sliding-window cache groups, per-layer specs, KV offloading.
"""
from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, NewType, Sequence

from minivllm.config import EngineConfig
from minivllm.utils.math_utils import cdiv

if TYPE_CHECKING:
    from minivllm.request import Request

BlockHash = NewType("BlockHash", bytes)  # 32 bytes of sha256

# The "parent" of every request's first block. vLLM draws it at random per process unless PYTHONHASHSEED
# is set; minivllm fixes it, so hashes (and what the notebooks print) repeat from run to run.
NONE_HASH = BlockHash(hashlib.sha256(b"minivllm NONE_HASH").digest())


def hash_block_tokens(parent_block_hash: BlockHash | None, curr_block_token_ids: Sequence[int]) -> BlockHash:
    """sha256(parent hash || token ids as little-endian int64): a stable name for a block and its whole prefix.

    Not Python's hash(): 64 bits (collisions can be found) and, for bytes and str, salted per process.
    hash_block_tokens(None, [7] * 16) names block 0 of any prompt of sixteen 7s; block 1 of a longer such
    prompt is hash_block_tokens(<that hash>, [7] * 16), which differs from it: the chain carries position.
    """
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    tokens = struct.pack(f"<{len(curr_block_token_ids)}q", *curr_block_token_ids)
    return BlockHash(hashlib.sha256(parent + tokens).digest())


def get_request_block_hasher(block_size: int) -> Callable[["Request"], list[BlockHash]]:
    """The function a Request calls whenever tokens arrive: the hashes of the blocks they newly filled.

    A 55-token prompt at block_size 16 gets 3 hashes (tokens 0-47); its 9th output, token 64, fills
    block 3 and adds a 4th. A partial block is never hashed.
    """
    def request_block_hasher(request: "Request") -> list[BlockHash]:
        start = len(request.block_hashes) * block_size
        if start + block_size > request.num_tokens:
            return []  # no new full block: the common case of a decode step
        token_ids = request.all_token_ids
        parent = request.block_hashes[-1] if request.block_hashes else None
        new_hashes = []
        while start + block_size <= len(token_ids):
            parent = hash_block_tokens(parent, token_ids[start:start + block_size])
            new_hashes.append(parent)
            start += block_size
        return new_hashes

    return request_block_hasher


def max_model_len_for(config: EngineConfig, hf_config) -> int:
    limit = hf_config.max_position_embeddings
    if config.max_model_len is not None and config.max_model_len > limit:
        raise ValueError(f"max_model_len={config.max_model_len} exceeds the model's "
                         f"max_position_embeddings={limit}: lower max_model_len.")
    return config.max_model_len or limit


def kv_cache_shape(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int,
                   head_size: int) -> tuple[int, ...]:
    """The KV cache of every layer as one tensor: [layers, 2 (K, V), blocks, block_size, kv_heads, head_size]."""
    return (num_layers, 2, num_blocks, block_size, num_kv_heads, head_size)


def kv_cache_bytes_per_block(hf_config, block_size: int, itemsize: int, tensor_parallel_size: int = 1) -> int:
    """K and V of one block in every layer, on one rank: the unit the pool is sized in. A rank holds
    num_kv_heads / tp heads, or one when there are more ranks than KV heads (each is then copied)."""
    total = getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads
    heads = max(1, total // tensor_parallel_size)
    head_size = getattr(hf_config, "head_dim", None) or hf_config.hidden_size // hf_config.num_attention_heads
    return math.prod(kv_cache_shape(hf_config.num_hidden_layers, 1, block_size, heads, head_size)) * itemsize


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


@dataclass(frozen=True)
class KVCacheConfig:
    """vLLM's KVCacheConfig (vllm/v1/kv_cache_interface.py), one group: how many blocks every worker allocates.

    EngineCore builds it from the workers' free memory and hands the same one to every worker, so all
    ranks hold the same block ids. Left out: per-layer KV cache groups (sliding window, mamba).
    """
    num_blocks: int
    block_size: int


def requested_kv_cache_bytes(config: EngineConfig) -> int:
    """The bytes a worker may give its KV cache (vLLM's Worker.determine_available_memory), asked once the
    weights are in memory: kv_cache_memory_bytes, else a gpu_memory_utilization fraction of what is free."""
    if config.num_gpu_blocks_override or config.kv_cache_memory_bytes:
        return config.kv_cache_memory_bytes or DEFAULT_KV_CACHE_BYTES  # the override needs no measuring
    if config.gpu_memory_utilization:
        free = free_memory_bytes(config.device)
        if free is None:
            raise ValueError("gpu_memory_utilization needs the free memory, which this OS does not report "
                             "(/proc/meminfo): set kv_cache_memory_bytes instead.")
        return int(config.gpu_memory_utilization * free)
    return DEFAULT_KV_CACHE_BYTES


def _sizing_argument(config: EngineConfig) -> str:
    """The engine argument that set the pool's size, named in errors. Precedence as vLLM."""
    if config.num_gpu_blocks_override:
        return "num_gpu_blocks_override"
    return "gpu_memory_utilization" if config.gpu_memory_utilization and not config.kv_cache_memory_bytes \
        else "kv_cache_memory_bytes"


def resolve_sizes(config: EngineConfig, hf_config) -> tuple[int, int]:
    """(max_model_len, num_gpu_blocks) for this model, from this process's view of the free memory.

    LLMEngine calls this before the model loads, to fail fast on a size this machine cannot hold;
    EngineCore sizes the real pool later from what its workers report (get_kv_cache_config).
    """
    kv_cache_config = get_kv_cache_config(config, hf_config, requested_kv_cache_bytes(config))
    return max_model_len_for(config, hf_config), kv_cache_config.num_blocks


def get_kv_cache_config(config: EngineConfig, hf_config, available_memory: int) -> KVCacheConfig:
    """vLLM's get_kv_cache_configs: the pool that fits `available_memory` bytes (or num_gpu_blocks_override).

    Checked on the CPU against MemAvailable: the KV pool, plus the runner's per-request rows
    (max_num_seqs x max_model_len token ids and block-table entries), once per rank on this machine.
    `available_memory` is one rank's; every rank allocates the same number of blocks of its own heads.
    vLLM's gpu_memory_utilization is a fraction of the whole device, weights included; on a CPU shared
    with the OS that total means little, so minivllm sizes only the KV cache from what is left after the
    weights.
    """
    max_model_len = max_model_len_for(config, hf_config)
    per_block = kv_cache_bytes_per_block(hf_config, config.block_size, _ITEMSIZE[config.dtype],
                                         config.tensor_parallel_size)
    num_blocks = config.num_gpu_blocks_override or max(2, available_memory // per_block)
    which = _sizing_argument(config)
    available = available_memory_bytes() if config.device == "cpu" else None
    if available is None:
        return KVCacheConfig(num_blocks, config.block_size)
    gib = 2**30
    kv_bytes = num_blocks * per_block * config.local_world_size
    if kv_bytes > available:
        raise ValueError(f"{which} asks for a KV cache of {num_blocks} blocks = {kv_bytes / gib:.1f} GiB, but this "
                         f"machine has {available / gib:.1f} GiB available: lower {which}.")
    rows = config.max_num_seqs * (max_model_len * 8 + cdiv(max_model_len, config.block_size) * 4) \
        * config.local_world_size
    if kv_bytes + rows > available:
        raise ValueError(f"max_num_seqs={config.max_num_seqs} at max_model_len={max_model_len} needs "
                         f"{rows / gib:.1f} GiB of per-request rows besides the {kv_bytes / gib:.1f} GiB KV cache, "
                         f"but this machine has {available / gib:.1f} GiB available: lower max_num_seqs or "
                         f"max_model_len.")
    return KVCacheConfig(num_blocks, config.block_size)
