"""Mirror of vllm/v1/core/block_pool.py and kv_cache_utils.py: the physical KV blocks.

The pool is the "page frame allocator" of the OS analogy. Block 0 is the
reserved null block and never handed out, so a fresh pool gives 1, 2, 3, ...
Free blocks sit in a doubly linked queue: popping from the head and removing
from the middle are both O(1). Left out: prefix-cache hashing and eviction
(we free straight back to the queue), KV events, hybrid KV-cache groups.
"""
from __future__ import annotations


class KVCacheBlock:
    __slots__ = ("block_id", "ref_cnt", "prev_free_block", "next_free_block")

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        self.ref_cnt = 0
        self.prev_free_block: KVCacheBlock | None = None
        self.next_free_block: KVCacheBlock | None = None

    def __repr__(self) -> str:
        return f"KVCacheBlock({self.block_id}, ref_cnt={self.ref_cnt})"


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
    def __init__(self, num_gpu_blocks: int) -> None:
        self.num_gpu_blocks = num_gpu_blocks
        self.blocks = [KVCacheBlock(i) for i in range(num_gpu_blocks)]
        self.free_block_queue = FreeKVCacheBlockQueue(self.blocks)
        # Block 0 is the null block: taken out once, never returned.
        self.null_block = self.free_block_queue.popleft()
        self.null_block.ref_cnt = 1

    def get_num_free_blocks(self) -> int:
        return self.free_block_queue.num_free_blocks

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        """Pop `num_blocks` from the head of the free queue: a fresh pool gives [1, 2, 3]."""
        if num_blocks > self.get_num_free_blocks():
            raise ValueError(f"cannot get {num_blocks} blocks, only {self.get_num_free_blocks()} free")
        blocks = [self.free_block_queue.popleft() for _ in range(num_blocks)]
        for block in blocks:
            assert block.ref_cnt == 0, block
            block.ref_cnt = 1
        return blocks

    def free_blocks(self, ordered_blocks: list[KVCacheBlock]) -> None:
        """Drop one reference each; blocks reaching zero go to the tail of the free queue."""
        for block in ordered_blocks:
            block.ref_cnt -= 1
            assert block.ref_cnt >= 0, block
            if block.ref_cnt == 0:
                self.free_block_queue.append(block)

    def get_usage(self) -> float:
        return 1.0 - self.get_num_free_blocks() / (self.num_gpu_blocks - 1)
