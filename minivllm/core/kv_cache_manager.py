"""Mirror of vllm/v1/core/kv_cache_manager.py: which blocks each request owns.

`allocate_slots` tops a request's block list up to cover its computed tokens
plus the new ones, or returns None (the "page fault" that triggers preemption).
`free` hands a request's blocks back in reverse order, as vLLM does so that
with prefix caching a request's tail blocks are evicted before its head. Left out: prefix caching, sliding windows, lookahead slots, KV connectors.
"""
from __future__ import annotations

from minivllm.core.block_pool import BlockPool, KVCacheBlock
from minivllm.request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class KVCacheManager:
    def __init__(self, block_size: int, num_gpu_blocks: int) -> None:
        self.block_size = block_size
        self.block_pool = BlockPool(num_gpu_blocks)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}

    @property
    def usage(self) -> float:
        return self.block_pool.get_usage()

    def allocate_slots(self, request: Request, num_new_tokens: int) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens; return the new blocks, or None if the pool is short."""
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_needed = cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - len(blocks)
        if num_needed > self.block_pool.get_num_free_blocks():
            return None
        new_blocks = self.block_pool.get_new_blocks(max(num_needed, 0))
        blocks.extend(new_blocks)
        return new_blocks

    def free(self, request: Request) -> None:
        # Reverse order: the tail block of a request (least likely shared) is freed first.
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.block_pool.free_blocks(reversed(blocks))

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]

    def get_num_blocks_needed(self, num_tokens: int) -> int:
        return cdiv(num_tokens, self.block_size)
