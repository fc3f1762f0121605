"""The labs' checks that need no engine: a submission's function against ours on hand-made inputs."""
from __future__ import annotations

import numpy as np
import torch

from minivllm.labs.errors import LabCheckFailed
from minivllm.request import RequestStatus
from minivllm.sampling_params import SamplingParams



def _lab7_chain(sub):
    h = sub["hash_block_tokens"]
    first = h(None, [7] * 8)
    if not isinstance(first, bytes) or len(first) != 32:
        raise LabCheckFailed("hash is chained", "hash_block_tokens(None, [7] * 8)", "32 bytes",
                             repr(first)[:60], "a sha256 digest")
    if h(first, [7] * 8) == first:
        raise LabCheckFailed("hash is chained", "hash_block_tokens(<block 0's hash>, [7] * 8)",
                             "a hash different from block 0's", "the same hash",
                             "block 1 of sixteen 7s is not block 0: the parent must enter the hash")
    if h(h(None, [1] * 8), [7] * 8) == h(h(None, [2] * 8), [7] * 8):
        raise LabCheckFailed("hash is chained", "block 1 = [7] * 8 after block 0 = [1] * 8 vs [2] * 8",
                             "different hashes", "equal hashes", "the parent's hash must enter the hash")


def _lab8_masks(sub):
    from minivllm.labs.exercises.lab08_top_k_top_p import apply_top_k_top_p as ref
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g)
    cases = [(torch.tensor([1, 5, 0, 50]), None), (None, torch.tensor([0.1, 0.5, 0.9, 1.0])),
             (torch.tensor([3, 10, 0, 20]), torch.tensor([0.5, 0.3, 0.95, 0.7]))]
    for top_k, top_p in cases:
        exp = torch.isfinite(ref(logits.clone(), top_k, top_p))
        got = torch.isfinite(sub["apply_top_k_top_p"](logits.clone(), top_k, top_p))
        for row in range(4):
            if not torch.equal(exp[row], got[row]):
                raise LabCheckFailed("masks = formula", f"top_k={top_k}, top_p={top_p}, row {row}, tokens kept",
                                     int(exp[row].sum()), int(got[row].sum()),
                                     "keep the k best, then the fewest best tokens whose mass reaches top_p")


def _lab5_unit(sub):
    from minivllm.labs.exercises import lab05_paged_kv as ref
    g = torch.Generator().manual_seed(0)
    key, value = torch.randn(5, 2, 4, generator=g), torch.randn(5, 2, 4, generator=g)
    slots = torch.tensor([9, 10, 3, -1, 17])  # block_size 4: block 2 slot 1, block 2 slot 2, block 0 slot 3, pad
    exp, got = torch.zeros(2, 6, 4, 2, 4), torch.zeros(2, 6, 4, 2, 4)
    ref.do_kv_cache_update(None, key, value, exp, slots)
    sub["do_kv_cache_update"](None, key, value, got, slots)
    for kv, name in ((0, "K"), (1, "V")):
        for slot in range(24):
            e, r = exp[kv].view(-1, 2, 4)[slot], got[kv].view(-1, 2, 4)[slot]
            if not torch.equal(e, r):
                tok = [i for i, s in enumerate(slots.tolist()) if s == slot]
                raise LabCheckFailed("write and read = formula", f"{name} cache, flat slot {slot} "
                                     f"(block {slot // 4}, offset {slot % 4})",
                                     f"token {tok[0]}'s {name}" if tok else "untouched (zeros)",
                                     "something else", "token i goes to flat slot slot_mapping[i]; -1 is padding")
    physical = torch.tensor([[2, 0], [5, 1]])
    e, r = ref.gather_blocks(exp[0], physical), sub["gather_blocks"](exp[0], physical)
    if tuple(r.shape) != tuple(e.shape) or not torch.equal(e, r):
        raise LabCheckFailed("write and read = formula", "gather_blocks(cache, [[2, 0], [5, 1]])",
                             f"shape {tuple(e.shape)}, blocks 2, 0 / 5, 1", f"shape {tuple(r.shape)}, other values",
                             "logical block j of a row is physical block physical[row, j]")


def _lab6_stops(sub):
    """check_stop on hand-made requests (EOS = 2): each case's expected (stopped, status, stop_reason)."""
    from minivllm.request import Request
    cases = [("EOS as the 3rd output token", dict(max_tokens=10), [5, 6, 2], (True, "FINISHED_STOPPED", None)),
             ("EOS with ignore_eos", dict(max_tokens=10, ignore_eos=True), [5, 2], (False, "RUNNING", None)),
             ("EOS before min_tokens", dict(max_tokens=10, min_tokens=3), [5, 2], (False, "RUNNING", None)),
             ("a stop_token_ids token", dict(max_tokens=10, stop_token_ids=[9]), [5, 9], (True, "FINISHED_STOPPED", 9)),
             ("max_tokens reached", dict(max_tokens=2), [5, 6], (True, "FINISHED_LENGTH_CAPPED", None)),
             ("one token short of max_tokens", dict(max_tokens=3), [5, 6], (False, "RUNNING", None))]
    for label, params, outputs, expected in cases:
        req = Request("r", [7, 7, 7], SamplingParams(temperature=0, **params), 2)
        req.status = RequestStatus.RUNNING
        for t in outputs:
            req.append_output_token_ids(t)
        stopped = sub["check_stop"](req, 8192)
        got = (bool(stopped), req.status.name, req.stop_reason)
        if got != expected:
            raise LabCheckFailed("EOS and stop_token_ids stop", f"{label}: outputs {outputs}, {params}",
                                 f"(stopped, status, stop_reason) = {expected}", got,
                                 "length first, then nothing before min_tokens, then EOS unless ignore_eos, "
                                 "then stop_token_ids")



_LAB3_NAMES = ("query_start_loc", "req_indices", "positions", "slot_mapping", "sampling", "logits_indices")
_LAB3_HINTS = {"query_start_loc": "where each request's rows start in the packed batch, then the total",
               "req_indices": "one entry per packed row: the request the row belongs to",
               "positions": "a request's rows continue its sequence where its KV cache ends",
               "slot_mapping": "a position's block is found in its own request's block_table row",
               "sampling": "only a request whose step reaches its last known token samples",
               "logits_indices": "lm_head runs on one row per sampling request, not on every packed row"}


def _lab3_packing(sub):
    """pack_indices on a decode, a middle prefill chunk and a whole new prompt (block_size 4)."""
    from minivllm.labs.exercises.lab03_input_packing import pack_indices as ref
    cases = [("decode 13+1, chunk 4+4 of 11, new prompt 0+5", [1, 4, 5], [13, 4, 0], [14, 11, 5]),
             ("two decodes 6+1 and 9+1, chunk 0+3 of 7", [1, 1, 3], [6, 9, 0], [7, 10, 7])]
    table = np.array([[7, 2, 9, 4], [3, 8, 6, 0], [5, 1, 0, 0]], dtype=np.int64)
    for label, sched, computed, known in cases:
        def args():  # fresh arrays for each call: a submission may write into its inputs
            return [np.array(sched, dtype=np.int64), np.array(computed, dtype=np.int64), table.copy(),
                    np.array(known, dtype=np.int64), 4]
        exp, got = ref(*args()), sub["pack_indices"](*args())
        if not isinstance(got, (tuple, list)) or len(got) != 6:
            raise LabCheckFailed("indices = formula", f"{label}: return value", "a tuple of 6 arrays",
                                 repr(got)[:80], "return " + ", ".join(_LAB3_NAMES))
        for name, e, g in zip(_LAB3_NAMES, exp, got):
            e, g = np.asarray(e).tolist(), np.asarray(g).tolist()
            if len(e) != len(g):
                raise LabCheckFailed("indices = formula", f"{label}: {name}, number of rows", len(e), len(g),
                                     _LAB3_HINTS[name])
            bad = next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), None)
            if bad is not None:
                raise LabCheckFailed("indices = formula", f"{label}: {name}[{bad}]", e[bad], g[bad], _LAB3_HINTS[name])


def _lab4_context(sub):
    """get_attention_context inside a hand-made forward context of two layers: each gets its own entries."""
    from types import SimpleNamespace
    from minivllm.forward_context import set_forward_context
    names = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    layers = {n: SimpleNamespace(layer_name=n, kv_cache=torch.zeros(i + 1)) for i, n in enumerate(names)}
    slots, metadata = {n: torch.tensor([i, 5]) for i, n in enumerate(names)}, SimpleNamespace(num_actual_tokens=2)
    parts = ("attn_metadata", "layer", "kv_cache", "slot_mapping")
    with set_forward_context(metadata, layers, slot_mapping=slots):
        for i, name in enumerate(names):
            got = sub["get_attention_context"](name)
            if not isinstance(got, (tuple, list)) or len(got) != 4:
                raise LabCheckFailed("context of the named layer", f"get_attention_context({name!r})",
                                     f"a tuple {parts}", repr(got)[:80], "return the four things a layer needs")
            expected = (metadata, layers[name], layers[name].kv_cache, slots[name])
            for part, e, g in zip(parts, expected, got):
                if g is not e:
                    owner = next((f"layer {j}'s {part}" for j, n in enumerate(names)
                                  if g is (layers[n] if part == "layer" else layers[n].kv_cache if part == "kv_cache"
                                           else slots[n])), "something else")
                    raise LabCheckFailed("context of the named layer", f"get_attention_context({name!r}), {part}",
                                         f"layer {i}'s {part}" if part != "attn_metadata" else "the step's metadata",
                                         owner, "every layer has its own KV cache and is looked up by its own name")
