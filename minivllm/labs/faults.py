"""Named faults: broken versions of the labs' functions, each the mistake a student is likely to make.

`python -m minivllm.labs check N --inject FAULT` grades the reference with one fault switched on (it must
fail: that is how we know the grader bites); `with minivllm.labs.inject(FAULT): LLM(...).generate(...)`
lets a student watch the consequence in a run or a trace.
"""
from __future__ import annotations

import hashlib
import struct

import torch

from minivllm.core.kv_cache_utils import NONE_HASH
from minivllm.core.sched.scheduler import Scheduler
import numpy as np

from minivllm.forward_context import get_forward_context
from minivllm.labs.exercises import (lab01_generate_loop, lab03_input_packing, lab04_forward_context, lab05_paged_kv,
                                    lab06_stop_and_free, lab08_top_k_top_p)
from minivllm.request import RequestStatus


def generate_one_step(engine, prompts, params):
    """Steps once per request instead of until has_unfinished_requests() is False."""
    ids = [engine.next_request_id() for _ in prompts]
    for rid, prompt in zip(ids, prompts):
        engine.add_request(rid, prompt, params)
    finished = {}
    for _ in prompts:
        for output in engine.step():
            finished[output.request_id] = output
    return [finished[r] for r in ids if r in finished]


def preempt_append(self, request) -> None:
    """Puts the victim at the tail of WAITING: newer requests overtake it (starvation)."""
    self.kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    self.num_preemptions += 1
    self.waiting.add_request(request)


def preempt_keep_progress(self, request) -> None:
    """Frees the KV but keeps num_computed_tokens: the resumed request reads KV that is gone."""
    self.kv_cache_manager.free(request)
    request.status = RequestStatus.PREEMPTED
    request.num_preemptions += 1
    self.num_preemptions += 1
    self.waiting.prepend_request(request)


def preempt_no_free(self, request) -> None:
    """Forgets the progress but not the blocks: the victim's blocks leak."""
    self.kv_cache_manager.req_to_blocks.pop(request.request_id, None)
    self.kv_cache_manager.num_cached_block.pop(request.request_id, None)
    request.status = RequestStatus.PREEMPTED
    request.num_computed_tokens = 0
    request.num_preemptions += 1
    self.num_preemptions += 1
    self.waiting.prepend_request(request)


def stop_off_by_one(request, max_model_len: int) -> bool:
    """`>` where `>=` belongs: every request runs one token past max_tokens."""
    params = request.sampling_params
    if params.max_tokens is not None and request.num_output_tokens == params.max_tokens:
        return False
    return lab06_stop_and_free.check_stop(request, max_model_len)


def stop_ignores_eos(request, max_model_len: int) -> bool:
    """Never stops at EOS: requests run on to max_tokens."""
    params = request.sampling_params
    max_tokens = params.max_tokens if params.max_tokens is not None else max_model_len
    if request.num_tokens >= max_model_len or request.num_output_tokens >= max_tokens:
        request.status = RequestStatus.FINISHED_LENGTH_CAPPED
        return True
    return False


def free_not_freed(self, request) -> None:
    """A finished request leaves the queues but its blocks never go back to the pool."""
    self.kv_cache_manager.req_to_blocks.pop(request.request_id, None)
    self.kv_cache_manager.num_cached_block.pop(request.request_id, None)
    self.finished_req_ids.add(request.request_id)
    del self.requests[request.request_id]


def hash_unchained(parent_block_hash, curr_block_token_ids) -> bytes:
    """Hashes the block's tokens alone: equal blocks after different prefixes share KV (wrong tokens)."""
    return hashlib.sha256(NONE_HASH + struct.pack(f"<{len(curr_block_token_ids)}q", *curr_block_token_ids)).digest()


def top_k_plus_one(logits, top_k, top_p):
    """Keeps k + 1 tokens: one token too many survives top-k."""
    k = None if top_k is None else torch.where(top_k > 0, top_k + 1, top_k)
    return lab08_top_k_top_p.apply_top_k_top_p(logits, k, top_p)


def top_p_ignored(logits, top_k, top_p):
    """Applies top-k only; the nucleus is never cut."""
    return lab08_top_k_top_p.apply_top_k_top_p(logits, top_k, None)

assert lab01_generate_loop  # imported so every lab's reference module is loaded with the faults


def slot_off_by_one(self, key, value, kv_cache, slot_mapping) -> None:
    """Writes every token one slot too far: the read finds the neighbour's K/V."""
    num_blocks, block_size = kv_cache.shape[1:3]
    shifted = torch.where(slot_mapping >= 0, (slot_mapping + 1) % (num_blocks * block_size), slot_mapping)
    lab05_paged_kv.do_kv_cache_update(self, key, value, kv_cache, shifted)


def block_table_shuffled(cache, physical):
    """Reads a request's blocks in reverse order: the history comes back scrambled."""
    return lab05_paged_kv.gather_blocks(cache, physical.flip(-1))



def logits_every_row(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Sends every packed row through lm_head instead of each sampling request's last row."""
    *head, _ = lab03_input_packing.pack_indices(num_scheduled, num_computed, block_table, num_tokens, block_size)
    return (*head, np.arange(len(head[1]), dtype=np.int64))


def positions_restart(num_scheduled, num_computed, block_table, num_tokens, block_size):
    """Positions start at 0 in every step's rows instead of at num_computed: a later chunk (or a decode)
    overwrites the request's first slots and gets the wrong rotary position."""
    qsl, req_indices, _, _, sampling, logits_indices = lab03_input_packing.pack_indices(
        num_scheduled, num_computed, block_table, num_tokens, block_size)
    positions = np.arange(len(req_indices)) - qsl[:-1][req_indices]
    slots = block_table[req_indices, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return qsl, req_indices, positions, slots, sampling, logits_indices


def wrong_layer_cache(layer_name):
    """Every layer gets layer 0's KV cache: each layer overwrites the others' history."""
    attn_metadata, layer, _, slot_mapping = lab04_forward_context.get_attention_context(layer_name)
    first = next(iter(get_forward_context().no_compile_layers.values()))
    return attn_metadata, layer, first.kv_cache, slot_mapping



_num_new_tokens = Scheduler._num_new_tokens  # ours, taken before anything is patched


def budget_clamp_removed(self, request, token_budget, num_computed_tokens=None):
    """Admits a waiting request with its whole prompt, whatever is left of the token budget."""
    if num_computed_tokens is None:
        return _num_new_tokens(self, request, token_budget)
    return _num_new_tokens(self, request, self.scheduler_config.max_model_len, num_computed_tokens)


def victim_fifo(self):
    """Preempts the head of RUNNING (the earliest admitted) instead of the tail (LIFO)."""
    return self.running[0]


# name -> (lab id, function it replaces, broken function, what it breaks)
FAULTS = {
    "generate-one-step": (1, "generate_loop", generate_one_step,
                          "loops a fixed number of steps instead of while has_unfinished_requests(): outputs missing"),
    "preempt-append": (2, "_preempt_request", preempt_append,
                       "prepend -> append: the victim goes to the tail of WAITING and newer requests overtake it"),
    "preempt-keep-progress": (2, "_preempt_request", preempt_keep_progress,
                              "num_computed_tokens not reset: the resumed request skips its recompute"),
    "preempt-no-free": (2, "_preempt_request", preempt_no_free,
                        "the victim's blocks are never freed: leaked blocks, more preemptions"),
    "stop-off-by-one": (6, "check_stop", stop_off_by_one, "max_tokens check with > instead of >=: one token too many"),
    "stop-ignores-eos": (6, "check_stop", stop_ignores_eos, "EOS never stops a request"),
    "free-not-freed": (6, "_free_request", free_not_freed, "finished requests not freed: leaked blocks"),
    "hash-unchained": (7, "hash_block_tokens", hash_unchained,
                       "the parent hash is dropped: a block matches after any prefix, wrong tokens"),
    "top-k-plus-one": (8, "apply_top_k_top_p", top_k_plus_one, "top-k keeps k + 1 tokens"),
    "top-p-ignored": (8, "apply_top_k_top_p", top_p_ignored, "top-p never applied"),
    "slot-off-by-one": (5, "do_kv_cache_update", slot_off_by_one,
                        "slot_mapping off by one: K/V written one slot too far, wrong tokens against HF"),
    "block-table-shuffled": (5, "gather_blocks", block_table_shuffled,
                             "block_table rows read in shuffled (reversed) order: wrong history, wrong tokens"),
    "logits-every-row": (3, "pack_indices", logits_every_row,
                         "logits for every packed row instead of logits_indices: wasted lm_head rows, wrong samples"),
    "positions-restart": (3, "pack_indices", positions_restart,
                          "positions restart at 0 each step instead of at num_computed_tokens: wrong chunked tokens"),
    "wrong-layer-cache": (4, "get_attention_context", wrong_layer_cache,
                          "every layer gets layer 0's KV cache: layers overwrite each other's K/V, wrong tokens"),
    "budget-clamp-removed": (2, "_num_new_tokens", budget_clamp_removed,
                             "the waiting loop admits a whole prompt past the token budget: budget exceeded"),
    "victim-fifo": (2, "_select_victim", victim_fifo,
                    "preemption picks the earliest running request instead of the latest (LIFO): wrong victims"),
}
