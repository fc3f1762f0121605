"""Unit checks of lab 7 (the chained block hash): the exact digest the lab specifies, and what chaining means.

The digest check runs the submission on blocks of 4, 8 and 16 tokens (token ids from 0 to the vocabulary's
last, odd-length chains) and compares each digest with the specified one. When a digest differs, the judge
recomputes the usual wrong variants here, in the grader's process, with hashlib alone, and names the one the
submission matches in the hint (tokens before the parent, int32 packing, an empty seed, a hex string).
"""
from __future__ import annotations

import hashlib
import random
import struct

from minivllm.core.kv_cache_utils import NONE_HASH
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit


def _chains() -> list[tuple[int, list[list[int]]]]:
    """(block_size, blocks of one prompt) at block sizes 4, 8 and 16: 3, 5 and 2 blocks."""
    rng = random.Random(7)
    out = []
    for block_size, n in ((4, 3), (8, 5), (16, 2)):
        blocks = [[rng.randrange(49152) for _ in range(block_size)] for _ in range(n)]
        blocks[0][0], blocks[-1][-1] = 0, 49151
        out.append((block_size, blocks))
    return out


_CHAINS = _chains()


def _show(value) -> str:
    if isinstance(value, bytes):
        return f"{len(value)} bytes {value.hex()[:16]}..."
    return f"{type(value).__name__} {repr(value)[:40]}"


@unit
def lab7_digest_observe(sub, llm, obs):
    """Each chain's digests, block by block, each block hashed with the submission's previous digest."""
    h, obs["chains"] = sub["hash_block_tokens"], []
    for _, blocks in _CHAINS:
        parent, digests = None, []
        for block in blocks:
            parent = h(parent, list(block))
            digests.append(parent.hex() if isinstance(parent, bytes) else _show(parent))
            if not isinstance(parent, bytes):
                break
        obs["chains"].append(digests)


def _variants(parent: bytes | None, block: list[int]) -> dict[str, str]:
    """Digests of the usual wrong readings of the specification -> the hint for each."""
    seed = NONE_HASH if parent is None else parent
    q, i = struct.pack(f"<{len(block)}q", *block), struct.pack(f"<{len(block)}i", *block)
    alone = hashlib.sha256(NONE_HASH + q).digest()
    chained = {} if parent is None else {
        alone.hex(): "block j's parent is block j-1's digest, not NONE_HASH: chain the blocks",
        bytes(a ^ b for a, b in zip(parent, alone)).hex(): "chain by hashing the parent's bytes followed by the "
        "tokens, not by combining two digests (XOR forgets the order of the blocks)"}
    return {**chained,hashlib.sha256(q + seed).hexdigest(): "the parent's hash comes first, then the token ids",
            hashlib.sha256(seed + i).hexdigest(): 'pack each token id as a little-endian int64 ("<{n}q"), not int32',
            hashlib.sha256((parent or b"") + q).hexdigest(): "the first block's parent is NONE_HASH "
            "(minivllm.core.kv_cache_utils), not empty bytes",
            hashlib.sha256(q).hexdigest(): "the parent's hash enters every block's digest, the first block's too "
            "(NONE_HASH)",
            hashlib.sha256(seed + struct.pack(f">{len(block)}q", *block)).hexdigest(): 'little-endian ("<"), not '
            "big-endian"}


def lab7_digest_judge(obs, ref):
    for (block_size, blocks), exp, got in zip(_CHAINS, ref["chains"], obs["chains"]):
        for j, (e, g) in enumerate(zip(exp, got)):
            where = f"block_size {block_size}, block {j} of {len(blocks)} (tokens {blocks[j][:3]}...)"
            if g != e:
                if not g or " " in g:  # not bytes: _show's "type repr"
                    raise LabCheckFailed("digest = the specified sha256", where, "32 bytes (hashlib's .digest())", g,
                                         "return the sha256 digest as bytes (.digest(), not .hexdigest())")
                hint = _variants(bytes.fromhex(exp[j - 1]) if j else None, blocks[j]).get(g) or (
                    "sha256 over the parent's 32 bytes (NONE_HASH for block 0) then the token ids as little-endian "
                    "int64; block j's parent is block j-1's digest")
                raise LabCheckFailed("digest = the specified sha256", where, e[:16] + "...", g[:16] + "...", hint)
        if len(got) != len(exp):
            raise LabCheckFailed("digest = the specified sha256", f"block_size {block_size}", f"{len(exp)} digests",
                                 f"{len(got)}", "return bytes for every block")


@unit
def lab7_chain_observe(sub, llm, obs):
    """What chaining must give: block 1 of sixteen 7s is not block 0; a different parent, a different digest;
    the same two blocks in the other order, different digests."""
    h = sub["hash_block_tokens"]
    a, b = [7] * 8, list(range(8))
    first = h(None, a)
    obs["chained"] = h(first, a) != first
    obs["prefix_counts"] = h(h(None, [1] * 8), a) != h(h(None, [2] * 8), a)
    obs["order_counts"] = h(h(None, a), b) != h(h(None, b), a)
    obs["deterministic"] = h(h(None, a), b) == h(h(None, list(a)), list(b))


def lab7_chain_judge(obs, ref):
    cases = [("chained", "hash(<block 0's hash>, [7] * 8) against block 0 = hash(None, [7] * 8)",
              "block 1 of sixteen 7s is not block 0: the parent's hash must enter the digest"),
             ("prefix_counts", "block [7] * 8 after block [1] * 8 vs after [2] * 8",
              "a different prefix must give a different name: the parent's hash enters the digest"),
             ("order_counts", "blocks A then B vs B then A (second block's hash)",
              "the chain must depend on the order of the blocks (XOR or a sum of block hashes does not)"),
             ("deterministic", "the same blocks hashed twice", "the same tokens after the same prefix must give "
              "the same hash (no randomness, no id() or Python's salted hash())")]
    for key, where, hint in cases:
        if obs[key] is not True:
            raise LabCheckFailed("hash is chained, in order", where, "different hashes" if key != "deterministic"
                                 else "equal hashes", "equal hashes" if key != "deterministic" else "different",
                                 hint)
