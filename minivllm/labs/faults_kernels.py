"""The broken functions of labs 3, 4, 5, 7 and 8 (indices, the forward context, the paged cache, the block hash,
top-k/top-p): each a mistake students make. faults.py names them and says which lab catches each.
"""
from __future__ import annotations

import hashlib
import struct

import numpy as np
import torch

from minivllm.core.kv_cache_utils import NONE_HASH
from minivllm.forward_context import get_forward_context
from minivllm.labs.exercises import (lab03_input_packing, lab04_forward_context, lab05_paged_kv, lab07_block_hash,
                                    lab08_top_k_top_p)

# -- lab 3 ------------------------------------------------------------------------------------------------
_pack = lab03_input_packing.pack_indices


def logits_every_row(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Sends every packed row through lm_head instead of each sampling request's last row."""
    *head, _ = _pack(num_scheduled, num_computed, block_table, num_tokens, block_size)
    return (*head, np.arange(len(head[1]), dtype=np.int64))


def positions_restart(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Positions start at 0 in every step's rows instead of at num_computed: a later chunk (or a decode)
    overwrites the request's first slots and gets the wrong rotary position."""
    qsl, req_indices, _, _, sampling, logits_indices = _pack(num_scheduled, num_computed, block_table, num_tokens,
                                                             block_size)
    positions = np.arange(len(req_indices)) - qsl[:-1][req_indices]
    slots = block_table[req_indices, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return qsl, req_indices, positions, slots, sampling, logits_indices


def pack_block_size_4(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """A constant 4 where block_size belongs (it passes every case at block size 4)."""
    return _pack(num_scheduled, num_computed, block_table, num_tokens, 4)


def sampling_strict(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """`>` where `>=` belongs: a request whose step ends exactly at its last known token does not sample."""
    qsl, req_indices, positions, slots, _, _ = _pack(num_scheduled, num_computed, block_table, num_tokens, block_size)
    sampling = np.nonzero(num_computed + num_scheduled > num_tokens)[0]
    return qsl, req_indices, positions, slots, sampling, qsl[1:][sampling] - 1


def logits_first_row(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Samples from each request's first row of the step instead of its last."""
    *head, sampling, _ = _pack(num_scheduled, num_computed, block_table, num_tokens, block_size)
    return (*head, sampling, head[0][:-1][sampling])


# -- lab 4 ------------------------------------------------------------------------------------------------
def wrong_layer_cache(layer_name):
    """Every layer gets layer 0's KV cache: each layer overwrites the others' history."""
    attn_metadata, layer, _, slot_mapping = lab04_forward_context.get_attention_context(layer_name)
    first = next(iter(get_forward_context().no_compile_layers.values()))
    return attn_metadata, layer, first.kv_cache, slot_mapping


_CONTEXTS: dict = {}


def context_cached(layer_name):
    """Remembers each layer's context from its first call: every later step reads the first step's metadata."""
    if layer_name not in _CONTEXTS:
        _CONTEXTS[layer_name] = lab04_forward_context.get_attention_context(layer_name)
    return _CONTEXTS[layer_name]


def context_slot_dict(layer_name):
    """Returns the forward context's whole slot_mapping dict instead of this layer's entry."""
    attn_metadata, layer, kv_cache, _ = lab04_forward_context.get_attention_context(layer_name)
    return attn_metadata, layer, kv_cache, get_forward_context().slot_mapping


def context_shared_slots(layer_name):
    """Every layer gets the first layer's slot_mapping."""
    attn_metadata, layer, kv_cache, _ = lab04_forward_context.get_attention_context(layer_name)
    return attn_metadata, layer, kv_cache, next(iter(get_forward_context().slot_mapping.values()))


# -- lab 5 ------------------------------------------------------------------------------------------------
def slot_off_by_one(self, key, value, kv_cache, slot_mapping) -> None:
    """Writes every token one slot too far: the read finds the neighbour's K/V."""
    num_blocks, block_size = kv_cache.shape[1:3]
    shifted = torch.where(slot_mapping >= 0, (slot_mapping + 1) % (num_blocks * block_size), slot_mapping)
    lab05_paged_kv.do_kv_cache_update(self, key, value, kv_cache, shifted)


def kv_padding_written(self, key, value, kv_cache, slot_mapping) -> None:
    """Clamps padding (-1) to slot 0 instead of skipping it: padding rows overwrite block 0's first slot."""
    lab05_paged_kv.do_kv_cache_update(self, key, value, kv_cache, slot_mapping.clamp(min=0))


def kv_swapped(self, key, value, kv_cache, slot_mapping) -> None:
    """Writes K into the V cache and V into the K cache."""
    lab05_paged_kv.do_kv_cache_update(self, value, key, kv_cache, slot_mapping)


def block_table_shuffled(cache, physical):
    """Reads a request's blocks in reverse order: the history comes back scrambled."""
    return lab05_paged_kv.gather_blocks(cache, physical.flip(-1))


def gather_block_size_4(cache, physical):
    """Reads blocks of a constant 4 slots (right only when block_size is 4)."""
    num_blocks, block_size, *rest = cache.shape
    as_fours = cache.reshape(num_blocks * block_size // 4, 4, *rest)
    return lab05_paged_kv.gather_blocks(as_fours, physical).repeat_interleave(block_size // 4, dim=-3)


# -- lab 7 ------------------------------------------------------------------------------------------------
def _packed(tokens) -> bytes:
    return struct.pack(f"<{len(tokens)}q", *tokens)


def hash_unchained(parent_block_hash, curr_block_token_ids) -> bytes:
    """Hashes the block's tokens alone: equal blocks after different prefixes share KV (wrong tokens)."""
    return hashlib.sha256(NONE_HASH + _packed(curr_block_token_ids)).digest()


def hash_xor_chain(parent_block_hash, curr_block_token_ids) -> bytes:
    """Chains by XOR with the parent: the order of the blocks no longer counts (X, Y hits Y, X)."""
    own = hashlib.sha256(NONE_HASH + _packed(curr_block_token_ids)).digest()
    parent = bytes(32) if parent_block_hash is None else parent_block_hash
    return bytes(a ^ b for a, b in zip(parent, own))


def hash_tokens_first(parent_block_hash, curr_block_token_ids) -> bytes:
    """sha256(tokens + parent): chained, but not the digest the lab specifies."""
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    return hashlib.sha256(_packed(curr_block_token_ids) + parent).digest()


def hash_int32(parent_block_hash, curr_block_token_ids) -> bytes:
    """Packs the token ids as int32 ("<i"): another digest than the specified one."""
    parent = NONE_HASH if parent_block_hash is None else parent_block_hash
    return hashlib.sha256(parent + struct.pack(f"<{len(curr_block_token_ids)}i", *curr_block_token_ids)).digest()


def hash_empty_seed(parent_block_hash, curr_block_token_ids) -> bytes:
    """Seeds the first block with empty bytes instead of NONE_HASH."""
    return lab07_block_hash.hash_block_tokens(b"" if parent_block_hash is None else parent_block_hash,
                                              curr_block_token_ids)


# -- lab 8 ------------------------------------------------------------------------------------------------
_top = lab08_top_k_top_p.apply_top_k_top_p


def top_k_plus_one(logits, top_k, top_p):
    """Keeps k + 1 tokens: one token too many survives top-k."""
    return _top(logits, None if top_k is None else torch.where(top_k > 0, top_k + 1, top_k), top_p)


def top_p_ignored(logits, top_k, top_p):
    """Applies top-k only; the nucleus is never cut."""
    return _top(logits, top_k, None)


def top_p_drops_crossing(logits, top_k, top_p):
    """Masks where the mass including the token passes top_p: the token that reaches top_p is dropped."""
    out = _top(logits, top_k, None)
    if top_p is None:
        return out
    sorted_logits, order = out.sort(dim=-1, descending=True)
    sorted_logits = sorted_logits.masked_fill(sorted_logits.softmax(-1).cumsum(-1) > top_p.unsqueeze(1),
                                              float("-inf"))
    return torch.full_like(out, float("-inf")).scatter(1, order, sorted_logits)


def top_k_zero_keeps_one(logits, top_k, top_p):
    """Reads k = 0 as "keep at least one" instead of "no limit"."""
    return _top(logits, None if top_k is None else top_k.clamp(min=1), top_p)


def top_p_before_top_k(logits, top_k, top_p):
    """Applies top-p on the whole distribution, then top-k: another nucleus when both are set."""
    return _top(_top(logits, None, top_p), top_k, None)
