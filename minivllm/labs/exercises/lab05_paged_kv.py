"""Lab 5 (article part 5): the paged KV cache in plain PyTorch. Write the write by slot and the read by block.

The write: token i's K (and V) goes to slot slot_mapping[i] of the flat cache, where
slot = block_table[pos // block_size] * block_size + pos % block_size. The read: logical block j of a request
is physical block block_table[j]. Graded inside the engine on its PyTorch attention backend. Time: about 40 minutes.
"""


def do_kv_cache_update(self, key, value, kv_cache, slot_mapping) -> None:
    """Write key/value [num_tokens, num_kv_heads, head_size] into kv_cache[0]/kv_cache[1]
    ([num_blocks, block_size, num_kv_heads, head_size]) at the flat slots slot_mapping [num_tokens]; slot -1 is padding.
    """
    ### BEGIN SOLUTION
    num_kv_heads, head_size = key.shape[1:]
    valid = slot_mapping >= 0
    key, value, slot_mapping = key[valid], value[valid], slot_mapping[valid]
    kv_cache[0].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, key)
    kv_cache[1].view(-1, num_kv_heads, head_size).index_copy_(0, slot_mapping, value)
    ### END SOLUTION


def gather_blocks(cache, physical):
    """Return the blocks physical [...] (physical block ids) of cache [num_blocks, block_size, H, D]
    as a tensor [..., block_size, H, D].
    """
    ### BEGIN SOLUTION
    flat = cache.view(cache.shape[0], -1)
    return flat.index_select(0, physical.reshape(-1)).view(*physical.shape, *cache.shape[1:])
    ### END SOLUTION
