"""Lab 5 (article part 5): the paged KV cache in plain PyTorch. Write the write by slot and the read by block.

The write: token i's K (and V) goes to slot slot_mapping[i] of the flat cache, where
slot = block_table[pos // block_size] * block_size + pos % block_size. The read: logical block j of a request
is physical block block_table[j]. Graded inside the engine on its PyTorch attention backend. Time: about 40 minutes.
"""


def do_kv_cache_update(self, key, value, kv_cache, slot_mapping) -> None:
    """Write key and value into the paged cache at the flat slots of slot_mapping; return None.

    Inputs: self, the TorchAttentionImpl (nothing of it is needed); key and value [num_tokens, num_kv_heads,
    head_size]; kv_cache [2, num_blocks, block_size, num_kv_heads, head_size] (kv_cache[0] the K cache,
    kv_cache[1] the V cache), written in place; slot_mapping, int64 [num_tokens], the flat slot of each token
    (slot s is block s // block_size, offset s % block_size), -1 for a padding row.
    Invariants: row i lands in slot slot_mapping[i] of both caches; a -1 row writes nothing (not the last
    slot); every other slot keeps its old value; it works for any block_size and head shape.
    Example (block_size 2, 3 blocks, 1 head, head_size 1): key [10, 20, 30], value [-10, -20, -30], slots
    [5, -1, 0] on a zero cache -> kv_cache[0] flattened is [30, 0, 0, 0, 0, 10] (block 2 offset 1 holds 10,
    block 0 offset 0 holds 30, the padding row's 20 nowhere), kv_cache[1] is [-30, 0, 0, 0, 0, -10].
    """
    ### BEGIN SOLUTION
    num_kv_heads, head_size = key.shape[1:]
    valid = slot_mapping >= 0
    key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    kv_cache[0].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, key)
    kv_cache[1].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, value)
    ### END SOLUTION


def gather_blocks(cache, physical):
    """Return the blocks `physical` (block ids, any shape [...]) of cache, as a tensor [..., block_size, H, D].

    Inputs: cache, one of the two caches [num_blocks, block_size, H, D]; physical, an int64 tensor of block
    ids, e.g. [num_reqs, blocks per request] read from the block tables.
    Output: out[idx] == cache[physical[idx]] for every index idx of physical: a new tensor, the cache untouched.
    Invariants: ids come in any order and may repeat (block ids are physical: a request's logical block j is
    wherever its block_table says); the result depends on block_size, H and D through the cache's shape only.
    Example: with the K cache above ([num_blocks 3, block_size 2, 1, 1], flattened [30, 0, 0, 0, 0, 10]),
    gather_blocks(cache, tensor([[2, 0]])) has shape [1, 2, 2, 1, 1] and flattened is [0, 10, 30, 0]
    (block 2, then block 0).
    """
    ### BEGIN SOLUTION
    flat = cache.view(cache.shape[0], -1)
    return flat.index_select(0, physical.reshape(-1)).view(*physical.shape, *cache.shape[1:])
    ### END SOLUTION
