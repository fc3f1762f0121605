"""Lab 7 (prefix caching): the chained block hash. Write hash_block_tokens.

A block's name must cover its whole prefix: two prompts share block i only if tokens 0 .. (i+1)*block_size - 1
are equal. Time: about 20 minutes.
"""
import hashlib
import struct

from minivllm.core.kv_cache_utils import NONE_HASH


def hash_block_tokens(parent_block_hash, curr_block_token_ids) -> bytes:
    """Name one full block by its tokens and every token before it: a 32-byte digest.

    Inputs: parent_block_hash, the digest of the previous block of the same sequence (None for block 0);
    curr_block_token_ids, the block's block_size token ids.
    Output (the specified digest, checked byte for byte): sha256 of the parent's 32 bytes (NONE_HASH, from
    minivllm.core.kv_cache_utils, for block 0) followed by the token ids, each a little-endian signed 64-bit
    integer; return the digest as bytes.
    Invariants: equal prefixes give equal digests, in every process (no salt, no randomness); a different
    token anywhere up to the block's end, or the same blocks in another order, gives another digest.
    Example: block 1 of the tokens [7] * 16 at block_size 8 is hash_block_tokens(hash_block_tokens(None, [7] * 8),
    [7] * 8), which differs from block 0's digest although the tokens are the same.
    """
    ### BEGIN SOLUTION
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    tokens = struct.pack(f"<{len(curr_block_token_ids)}q", *curr_block_token_ids)
    return hashlib.sha256(parent + tokens).digest()
    ### END SOLUTION
