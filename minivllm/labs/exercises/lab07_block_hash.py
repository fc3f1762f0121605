"""Lab 7 (prefix caching): the chained block hash. Write hash_block_tokens.

A block's name must cover its whole prefix: two prompts share block i only if tokens 0 .. (i+1)*block_size - 1
are equal. Time: about 20 minutes.
"""
import hashlib
import struct

from minivllm.core.kv_cache_utils import NONE_HASH


def hash_block_tokens(parent_block_hash, curr_block_token_ids) -> bytes:
    """sha256 over the parent's hash (NONE_HASH for the first block) followed by the block's token ids
    packed as little-endian int64 (struct format "<{n}q"); return the 32-byte digest.
    """
    ### BEGIN SOLUTION
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    tokens = struct.pack(f"<{len(curr_block_token_ids)}q", *curr_block_token_ids)
    return hashlib.sha256(parent + tokens).digest()
    ### END SOLUTION
