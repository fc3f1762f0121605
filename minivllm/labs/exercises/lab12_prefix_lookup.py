"""Lab 12 (the KV cache manager): the prefix-cache lookup. Write KVCacheManager.get_computed_blocks.

When the scheduler is about to admit a waiting request it asks the KV cache manager how much of the request's
prompt is already in the cache: those tokens need no forward pass. The answer is a list of cached blocks (the
scheduler hands it to allocate_slots, which takes them) and the number of tokens they cover. Nothing is taken
here: a request that does not fit this step stays waiting and asks again later. Time: about 30 minutes.
"""


def get_computed_blocks(self, request):
    """Return (blocks, num_computed_tokens): the cached blocks holding the start of `request`'s tokens.

    Inputs: self, the KVCacheManager (self.block_size; self.enable_caching; self.block_pool, whose
    get_cached_block(block_hash) gives a block holding that hash, in use or free, or None); request:
    num_tokens (prompt + outputs so far), block_hashes (one chained hash per full block of its tokens, in
    order; a partial last block has none) and skip_reading_prefix_cache (True when it asks for prompt
    logprobs: those need every prompt position computed, so it must not read the cache).
    Rules:
      - with caching off, or a request that skips reading the cache: ([], 0);
      - the hits are a prefix: block i is of use only if blocks 0 .. i-1 hit too; stop at the first miss;
      - at most num_tokens - 1 tokens, in whole blocks: the last token must run to give the logits that
        sample the next token, so a prompt cached whole still recomputes its last block;
      - look up only; no block changes hands here (allocate_slots touches the hits when it takes them).
    Invariants: num_computed_tokens == len(blocks) * block_size <= num_tokens - 1; blocks[i] holds
    request.block_hashes[i]; ref_cnt and the free queue are as before the call.
    Example (block_size 4): a 12-token prompt whose 3 blocks are all cached -> its first 2 blocks, 8 tokens;
    a 9-token prompt with blocks 0 and 2 cached but block 1 evicted -> [block 0], 4.
    """
    ### BEGIN SOLUTION
    if not self.enable_caching or request.skip_reading_prefix_cache:
        return [], 0
    max_num_blocks = (request.num_tokens - 1) // self.block_size
    blocks = []
    for block_hash in request.block_hashes[:max_num_blocks]:
        block = self.block_pool.get_cached_block(block_hash)
        if block is None:
            break
        blocks.append(block)
    return blocks, len(blocks) * self.block_size
    ### END SOLUTION
