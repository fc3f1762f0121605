"""Mirror of vllm/v1/core/block_pool.py and kv_cache_utils.py: the physical KV blocks and the prefix cache.

The pool is the "page frame allocator" of the OS analogy. Block 0 is the
reserved null block and never handed out, so a fresh pool gives 1, 2, 3, ...
Free blocks sit in a doubly linked queue: popping from the head and removing
from the middle are both O(1).

Prefix caching (vLLM's design): a full block gets a `block_hash` and an entry in
`cached_block_hash_to_block`. Freed, it keeps both and waits in the free queue,
still a hit for the next request with that prefix (`touch` takes it back out).
Eviction is lazy: only when `get_new_blocks` pops a cached block for new tokens
does its hash go. The queue's order is thus the eviction order (LRU, and a
request's tail before its head, since requests free in reverse).
Left out: KV events, hybrid KV-cache groups, block-hash metrics.
"""
from __future__ import annotations

from minivllm.core.kv_cache_utils import BlockHash
from minivllm.request import Request


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "block_hash", "prev_free_block", "next_free_block")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0  # how many requests hold it: > 1 when a cached prefix is shared
        self.block_hash: BlockHash | None = None  # set once the block is full and cached
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        cached = f", hash={self.block_hash.hex()[:8]}" if self.block_hash is not None else ""
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt}{cached})"


class FreeKVCacheBlockQueue:
    """Doubly linked list of free blocks between two sentinels: [head] <-> b1 <-> b2 <-> [tail]."""

    def __init__(self, blocks: list[KVCacheBlock]) -> None:
        self.num_free_blocks = 0
        self._head = KVCacheBlock(-1)
        self._tail = KVCacheBlock(-1)
        self._head.next_free_block = self._tail
        self._tail.prev_free_block = self._head
        for block in blocks:
            self.append(block)

    def popleft(self) -> KVCacheBlock:
        block = self._head.next_free_block
        if block is self._tail:
            raise ValueError("no free block left")
        self.remove(block)
        return block

    def remove(self, block: KVCacheBlock) -> None:
        block.prev_free_block.next_free_block = block.next_free_block
        block.next_free_block.prev_free_block = block.prev_free_block
        block.prev_free_block = block.next_free_block = None
        self.num_free_blocks -= 1

    def append(self, block: KVCacheBlock) -> None:
        last = self._tail.prev_free_block
        last.next_free_block = block
        block.prev_free_block = last
        block.next_free_block = self._tail
        self._tail.prev_free_block = block
        self.num_free_blocks += 1

    def get_all_free_blocks(self) -> list[KVCacheBlock]:
        out, block = [], self._head.next_free_block
        while block is not self._tail:
            out.append(block)
            block = block.next_free_block
        return out


class BlockPool:
    def __init__(self, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.enable_caching = enable_caching
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # block hash -> {block id: block}. Usually one block per hash; two requests that computed the same
        # block side by side each keep theirs (block tables are append-only, never rewritten to dedupe).
        self.cached_block_hash_to_block: dict[BlockHash, dict[int, KVCacheBlock]] = {}
        # Block 0 is the null block: taken out once, never returned.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.ref_cnt = 1

    def get_num_free_blocks(self) -> int:
        """Free blocks, cached ones waiting for a hit included: all can be handed out."""
        return self.free_block_queue.num_free_blocks

    def get_usage(self) -> float:
        """The fraction of the pool in use, the null block not counted (the KV-cache usage gauge in /metrics)."""
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)

    def get_cached_block(self, block_hash: BlockHash) -> KVCacheBlock | None:
        """A block holding this prefix, in use or free, or None: a cache miss."""
        blocks = self.cached_block_hash_to_block.get(block_hash)
        return next(iter(blocks.values())) if blocks else None

    def cache_full_blocks(self, request: Request, blocks: list[KVCacheBlock], num_cached_blocks: int,
                          num_full_blocks: int) -> None:
        """Name blocks[num_cached_blocks:num_full_blocks] by the request's block hashes and enter them in the cache.

        Called at allocation time, before the forward pass writes them: a request admitted later in the
        same step may already hit them (safe here, see KVCacheManager.allocate_slots).
        """
        for i in range(num_cached_blocks, num_full_blocks):
            block, block_hash = blocks[i], request.block_hashes[i]
            assert block.block_hash is None, block
            block.block_hash = block_hash
            self.cached_block_hash_to_block.setdefault(block_hash, {})[block.block_id] = block

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue: a fresh pool gives [1, 2, 3].

        A popped block that still holds a cached prefix is evicted now (lazy eviction): its hash goes.
        """
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} blocks, only {self.get_num_free_blocks()} free")
        blocks = [self.free_block_queue.popleft() for _ in range(num_blocks)]
        for block in blocks:
            assert block.ref_cnt == 0, block
            if self.enable_caching:
                self._maybe_evict_cached_block(block)
            block.ref_cnt = 1
        return blocks

    def _maybe_evict_cached_block(self, block: KVCacheBlock) -> bool:
        """Take `block` out of the prefix cache (its KV is about to be overwritten); True if it was cached."""
        if block.block_hash is None:
            return False
        same_hash = self.cached_block_hash_to_block[block.block_hash]
        del same_hash[block.block_id]
        if not same_hash:
            del self.cached_block_hash_to_block[block.block_hash]
        block.block_hash = None
        return True

    def evict_blocks(self, blocks: list[KVCacheBlock]) -> None:
        """Drop these blocks from the prefix cache now, wherever they are (e.g. their KV was never written)."""
        for block in blocks:
            self._maybe_evict_cached_block(block)

    def touch(self, blocks: list[KVCacheBlock]) -> None:
        """A prefix-cache hit: one more owner each; a free cached block leaves the free queue (revived)."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_block_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks) -> None:
        """Drop one reference each; blocks reaching zero go to the tail of the free queue, hash kept.

        `ordered_blocks` comes first-to-evict first: a request's blocks in reverse, tail first.
        """
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, block
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix (e.g. after new weights). As vLLM: refused (False) while any block is in use."""
        if self.num_gpu_blocks - self.get_num_free_blocks() != 1:  # the null block is always "used"
            return False
        self.cached_block_hash_to_block = {}
        for block in self.blocks:
            block.block_hash = None
        return True
