"""Mirror of vllm/v1/core/kv_cache_manager.py: which blocks each request owns, and the prefix-cache lookup.

`get_computed_blocks` finds how much of a waiting request's prompt is already in
the cache: the longest run of its block hashes that hit, in whole blocks.
`allocate_slots` adopts those blocks (ref_cnt + 1), tops the request's block list
up to cover its computed tokens plus the new ones, and caches every block those
tokens fill, or returns None (the "page fault" that triggers preemption).
`free` hands a request's blocks back in reverse order, so that its tail blocks
are evicted before its head (the head is what other requests share).
`uncache_unwritten_blocks` is for the scheduler's priority preemption of a request
it had already planned this step: the blocks cached for its withdrawn tokens hold no KV.
Left out: sliding windows and hybrid groups (vLLM's KVCacheCoordinator),
lookahead slots, KV connectors, KV events, cascade attention's common prefix.
"""
from __future__ import annotations

from dataclasses import dataclass

from minivllm.core.block_pool import BlockPool, KVCacheBlock
from minivllm.request import Request
from minivllm.utils.math_utils import cdiv


@dataclass
class PrefixCacheStats:
    """vLLM's PrefixCacheStats (v1/metrics/stats.py), kept cumulative: prompt tokens looked up and found.

    A resumed request hitting its own blocks again is counted apart, as vLLM does, so the hit rate
    hits / queries measures sharing between requests, not recovery from preemption.
    """
    requests: int = 0
    queries: int = 0  # tokens of the requests looked up
    hits: int = 0  # tokens found in the cache
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hits: int, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hits
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hits


class KVCacheManager:
    def __init__(self, block_size: int, num_gpu_blocks: int, enable_caching: bool = True) -> None:
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.block_pool = BlockPool(num_gpu_blocks, enable_caching)
        self.req_to_blocks: dict[str, list[KVCacheBlock]] = {}
        self.num_cached_block: dict[str, int] = {}  # how many of a request's blocks are in the cache
        self.prefix_cache_stats = PrefixCacheStats()

    @property
    def usage(self) -> float:
        """The KV cache's usage, 0 to 1 (vLLM's SchedulerStats.kv_cache_usage)."""
        return self.block_pool.get_usage()

    def get_computed_blocks(self, request: Request) -> tuple[list[KVCacheBlock], int]:
        """(cached blocks, num_computed_tokens) for a request about to be admitted; nothing is taken yet.

        At most num_tokens - 1 tokens, floored to whole blocks: even when the whole prompt is cached its
        last token must run, for the logits that sample the first output. So a 64-token prompt seen before
        hits 48 tokens (3 blocks of 16) and recomputes the last block, not 64.
        """
        if not self.enable_caching or request.skip_reading_prefix_cache:
            return [], 0
        max_num_blocks = (request.num_tokens - 1) // self.block_size
        computed_blocks = []
        for block_hash in request.block_hashes[:max_num_blocks]:
            block = self.block_pool.get_cached_block(block_hash)
            if block is None:
                break  # a prefix: a later block, even if cached, is of no use without this one
            computed_blocks.append(block)
        return computed_blocks, len(computed_blocks) * self.block_size

    def record_prefix_cache_stats(self, request: Request, num_hits: int) -> None:
        """Count one admitted request's lookup (not one that skipped the cache)."""
        if self.enable_caching and not request.skip_reading_prefix_cache:
            self.prefix_cache_stats.record(request.num_tokens, num_hits, request.num_preemptions > 0)

    def allocate_slots(self, request: Request, num_new_tokens: int, num_new_computed_tokens: int = 0,
                       new_computed_blocks: list[KVCacheBlock] | None = None) -> list[KVCacheBlock] | None:
        """Make room for `num_new_tokens` more tokens after the computed ones; return the new blocks, or None.

        Blocks layout: | computed | new_computed (cache hits) | new (to run this step) |, the last two
        only for a request just admitted. Every block the new tokens fill is cached right here, before the
        forward pass has written it, as vLLM does: a request admitted later in this same step may hit it.
        That is safe here: in every layer, Attention.forward first writes the K/V of all the step's tokens
        (unified_kv_cache_update), then reads (unified_attention_with_output), and each backend's read takes
        the history from the cache it just wrote: torch (index_copy_, then gather + SDPA for any request
        with history, which a hit always has), cpu (_C.reshape_and_cache, then _C.paged_attention) and
        triton (reshape_and_cache_flash, then unified_attention, kernels queued in order on one stream).
        """
        new_computed_blocks = new_computed_blocks or []
        blocks = self.req_to_blocks.setdefault(request.request_id, [])
        num_computed_tokens = request.num_computed_tokens + num_new_computed_tokens
        num_needed = max(cdiv(num_computed_tokens + num_new_tokens, self.block_size)
                         - len(blocks) - len(new_computed_blocks), 0)
        # A hit on a free cached block takes it out of the free queue too.
        num_revived = sum(block.ref_cnt == 0 for block in new_computed_blocks)
        if num_needed + num_revived > self.block_pool.get_num_free_blocks():
            return None
        if new_computed_blocks:  # touched before get_new_blocks, which could otherwise evict them
            self.block_pool.touch(new_computed_blocks)
            blocks.extend(new_computed_blocks)
            self.num_cached_block[request.request_id] = len(blocks)
        new_blocks = self.block_pool.get_new_blocks(num_needed)
        blocks.extend(new_blocks)
        self.cache_blocks(request, num_computed_tokens + num_new_tokens)
        return new_blocks

    def cache_blocks(self, request: Request, num_computed_tokens: int) -> None:
        """Enter in the prefix cache the request's full blocks up to num_computed_tokens. Only tokens that exist
        are cached (an async step's placeholder has no value yet, hence no hash): min(that, num_tokens)."""
        if not self.enable_caching:
            return
        num_full_blocks = min(num_computed_tokens, request.num_tokens) // self.block_size
        num_full_blocks = min(num_full_blocks, len(request.block_hashes))  # no hasher: nothing to name
        num_cached = self.num_cached_block.get(request.request_id, 0)
        if num_full_blocks > num_cached:
            blocks = self.req_to_blocks[request.request_id]
            self.block_pool.cache_full_blocks(request, blocks, num_cached, num_full_blocks)
            self.num_cached_block[request.request_id] = num_full_blocks

    def free(self, request: Request) -> None:
        """Give the request's blocks back, tail first; cached ones stay cached until evicted."""
        blocks = self.req_to_blocks.pop(request.request_id, [])
        self.num_cached_block.pop(request.request_id, None)
        self.block_pool.free_blocks(reversed(blocks))

    def uncache_unwritten_blocks(self, request: Request) -> None:
        """Take out of the prefix cache the request's blocks past its num_computed_tokens: allocate_slots cached
        them for tokens that now will not run (the scheduler withdrew them), so they hold no KV."""
        blocks = self.req_to_blocks.get(request.request_id, [])
        num_cached = self.num_cached_block.get(request.request_id, 0)
        num_written = request.num_computed_tokens // self.block_size
        if num_cached > num_written:
            assert all(b.ref_cnt == 1 for b in blocks[num_written:num_cached]), blocks
            self.block_pool.evict_blocks(blocks[num_written:num_cached])
            self.num_cached_block[request.request_id] = num_written

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix; False (nothing done) while any request holds blocks, as vLLM."""
        if not self.block_pool.reset_prefix_cache():
            return False
        self.prefix_cache_stats = PrefixCacheStats()
        return True

    def get_block_ids(self, request_id: str) -> list[int]:
        return [b.block_id for b in self.req_to_blocks.get(request_id, [])]
