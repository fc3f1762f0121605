"""The labs' checks that need no engine run: a submission's function on hand-made inputs, judged against ours.

Each check is two halves: `*_observe(sub, llm, obs)` runs in the grading process and records what the
function returned, as plain data, in `obs`; `*_judge(obs, ref)` runs in the grader's own process and compares
it with `ref`, the same observation made with the engine's own function.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.labs.errors import LabCheckFailed
from minivllm.request import RequestStatus
from minivllm.sampling_params import SamplingParams


def _hex(value):
    return value.hex() if isinstance(value, bytes) else None


# -- lab 7 ------------------------------------------------------------------------------------------------
def lab7_observe(sub, llm, obs):
    h = sub["hash_block_tokens"]
    first = h(None, [7] * 8)
    obs.update(first=_hex(first), first_repr=repr(first)[:60], first_len=len(first) if isinstance(first, bytes) else None)
    obs["chained"] = h(first, [7] * 8) != first
    obs["prefix_counts"] = h(h(None, [1] * 8), [7] * 8) != h(h(None, [2] * 8), [7] * 8)


def lab7_judge(obs, ref):
    if obs["first"] is None or obs["first_len"] != 32:
        raise LabCheckFailed("hash is chained", "hash_block_tokens(None, [7] * 8)", "32 bytes", obs["first_repr"],
                             "a sha256 digest")
    if obs["chained"] is not True:
        raise LabCheckFailed("hash is chained", "hash_block_tokens(<block 0's hash>, [7] * 8)",
                             "a hash different from block 0's", "the same hash",
                             "block 1 of sixteen 7s is not block 0: the parent must enter the hash")
    if obs["prefix_counts"] is not True:
        raise LabCheckFailed("hash is chained", "block 1 = [7] * 8 after block 0 = [1] * 8 vs [2] * 8",
                             "different hashes", "equal hashes", "the parent's hash must enter the hash")


# -- lab 8 ------------------------------------------------------------------------------------------------
_LAB8_CASES = [([1, 5, 0, 50], None), (None, [0.1, 0.5, 0.9, 1.0]), ([3, 10, 0, 20], [0.5, 0.3, 0.95, 0.7])]


def lab8_observe(sub, llm, obs):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    obs["kept"] = []
    for top_k, top_p in _LAB8_CASES:
        k = None if top_k is None else torch.tensor(top_k)
        p = None if top_p is None else torch.tensor(top_p)
        obs["kept"].append(torch.isfinite(sub["apply_top_k_top_p"](logits.clone(), k, p)).tolist())


def lab8_judge(obs, ref):
    for (top_k, top_p), exp, got in zip(_LAB8_CASES, ref["kept"], obs["kept"]):
        for row in range(4):
            if exp[row] != got[row]:
                raise LabCheckFailed("masks = formula", f"top_k={top_k}, top_p={top_p}, row {row}, tokens kept",
                                     sum(exp[row]), sum(bool(x) for x in got[row]),
                                     "keep the k best, then the fewest best tokens whose mass reaches top_p")


# -- lab 5 ------------------------------------------------------------------------------------------------
def lab5_observe(sub, llm, obs):
    g = torch.Generator().manual_seed(0)
    key, value = torch.randn(5, 2, 4, generator=g), torch.randn(5, 2, 4, generator=g)
    slots = torch.tensor([9, 10, 3, -1, 17])  # block_size 4: block 2 slot 1, block 2 slot 2, block 0 slot 3, pad
    cache = torch.zeros(2, 6, 4, 2, 4)
    sub["do_kv_cache_update"](None, key, value, cache, slots)
    obs["slots"] = [cache[kv].view(-1, 8).tolist() for kv in (0, 1)]
    got = sub["gather_blocks"](cache[0], torch.tensor([[2, 0], [5, 1]]))
    obs["gather_shape"] = list(got.shape) if isinstance(got, torch.Tensor) else repr(got)[:60]
    obs["gather"] = got.tolist() if isinstance(got, torch.Tensor) else None


def lab5_judge(obs, ref):
    slots = [9, 10, 3, -1, 17]
    for kv, name in ((0, "K"), (1, "V")):
        for slot in range(24):
            if obs["slots"][kv][slot] != ref["slots"][kv][slot]:
                tok = [i for i, s in enumerate(slots) if s == slot]
                raise LabCheckFailed("write and read = formula", f"{name} cache, flat slot {slot} "
                                     f"(block {slot // 4}, offset {slot % 4})",
                                     f"token {tok[0]}'s {name}" if tok else "untouched (zeros)",
                                     "something else", "token i goes to flat slot slot_mapping[i]; -1 is padding")
    if obs["gather_shape"] != ref["gather_shape"] or obs["gather"] != ref["gather"]:
        raise LabCheckFailed("write and read = formula", "gather_blocks(cache, [[2, 0], [5, 1]])",
                             f"shape {tuple(ref['gather_shape'])}, blocks 2, 0 / 5, 1",
                             f"shape {obs['gather_shape']}, other values",
                             "logical block j of a row is physical block physical[row, j]")


# -- lab 6 ------------------------------------------------------------------------------------------------
_LAB6_CASES = [("EOS as the 3rd output token", dict(max_tokens=10), [5, 6, 2]),
               ("EOS with ignore_eos", dict(max_tokens=10, ignore_eos=True), [5, 2]),
               ("EOS before min_tokens", dict(max_tokens=10, min_tokens=3), [5, 2]),
               ("a stop_token_ids token", dict(max_tokens=10, stop_token_ids=[9]), [5, 9]),
               ("max_tokens reached", dict(max_tokens=2), [5, 6]),
               ("one token short of max_tokens", dict(max_tokens=3), [5, 6])]


def lab6_observe(sub, llm, obs):
    """check_stop on hand-made requests (EOS = 2): each case's (stopped, status, stop_reason)."""
    from minivllm.request import Request
    obs["cases"] = []
    for _, params, outputs in _LAB6_CASES:
        req = Request("r", [7, 7, 7], SamplingParams(temperature=0, **params), 2)
        req.status = RequestStatus.RUNNING
        for t in outputs:
            req.append_output_token_ids(t)
        stopped = sub["check_stop"](req, 8192)
        reason = req.stop_reason
        obs["cases"].append([bool(stopped), req.status.name, reason if isinstance(reason, (int, str)) else None])


def lab6_judge(obs, ref):
    for (label, params, outputs), exp, got in zip(_LAB6_CASES, ref["cases"], obs["cases"]):
        if got != exp:
            raise LabCheckFailed("EOS and stop_token_ids stop", f"{label}: outputs {outputs}, {params}",
                                 f"(stopped, status, stop_reason) = {tuple(exp)}", tuple(got),
                                 "length first, then nothing before min_tokens, then EOS unless ignore_eos, "
                                 "then stop_token_ids")


# -- lab 3 ------------------------------------------------------------------------------------------------
_LAB3_NAMES = ("query_start_loc", "req_indices", "positions", "slot_mapping", "sampling", "logits_indices")
_LAB3_HINTS = {"query_start_loc": "where each request's rows start in the packed batch, then the total",
               "req_indices": "one entry per packed row: the request the row belongs to",
               "positions": "a request's rows continue its sequence where its KV cache ends",
               "slot_mapping": "a position's block is found in its own request's block_table row",
               "sampling": "only a request whose step reaches its last known token samples",
               "logits_indices": "lm_head runs on one row per sampling request, not on every packed row"}
_LAB3_TABLE = [[7, 2, 9, 4], [3, 8, 6, 0], [5, 1, 0, 0]]
_LAB3_CASES = [("decode 13+1, chunk 4+4 of 11, new prompt 0+5", [1, 4, 5], [13, 4, 0], [14, 11, 5], 4),
               ("two decodes 6+1 and 9+1, chunk 0+3 of 7", [1, 1, 3], [6, 9, 0], [7, 10, 7], 4),
               ("block_size 16: decode 37+1, chunk 16+9 of 33, new prompt 0+7", [1, 9, 7], [37, 16, 0], [38, 33, 7],
                16)]


def lab3_observe(sub, llm, obs):
    """pack_indices on decodes, a middle prefill chunk and a whole new prompt (block sizes 4 and 16)."""
    obs["cases"] = []
    for _, sched, computed, known, block_size in _LAB3_CASES:
        got = sub["pack_indices"](np.array(sched, dtype=np.int64), np.array(computed, dtype=np.int64),
                                  np.array(_LAB3_TABLE, dtype=np.int64), np.array(known, dtype=np.int64), block_size)
        if not isinstance(got, (tuple, list)) or len(got) != 6:
            obs["cases"].append(repr(got)[:80])
        else:
            obs["cases"].append([np.asarray(a).reshape(-1).tolist() for a in got])


def lab3_judge(obs, ref):
    for (label, *_), exp, got in zip(_LAB3_CASES, ref["cases"], obs["cases"]):
        if not isinstance(got, list):
            raise LabCheckFailed("indices = formula", f"{label}: return value", "a tuple of 6 arrays", got,
                                 "return " + ", ".join(_LAB3_NAMES))
        for name, e, g in zip(_LAB3_NAMES, exp, got):
            if len(e) != len(g):
                raise LabCheckFailed("indices = formula", f"{label}: {name}, number of rows", len(e), len(g),
                                     _LAB3_HINTS[name])
            bad = next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), None)
            if bad is not None:
                raise LabCheckFailed("indices = formula", f"{label}: {name}[{bad}]", e[bad], g[bad], _LAB3_HINTS[name])


# -- lab 4 ------------------------------------------------------------------------------------------------
_LAB4_NAMES = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
_LAB4_PARTS = ("attn_metadata", "layer", "kv_cache", "slot_mapping")


def lab4_observe(sub, llm, obs):
    """get_attention_context inside a hand-made forward context of two layers: which object each part is."""
    from types import SimpleNamespace
    from minivllm.forward_context import set_forward_context
    layers = {n: SimpleNamespace(layer_name=n, kv_cache=torch.zeros(i + 1)) for i, n in enumerate(_LAB4_NAMES)}
    slots = {n: torch.tensor([i, 5]) for i, n in enumerate(_LAB4_NAMES)}
    metadata = SimpleNamespace(num_actual_tokens=2)
    known = [(metadata, "the step's metadata")]
    for j, n in enumerate(_LAB4_NAMES):
        known += [(layers[n], f"layer {j}'s layer"), (layers[n].kv_cache, f"layer {j}'s kv_cache"),
                  (slots[n], f"layer {j}'s slot_mapping")]
    obs["layers"] = []
    with set_forward_context(metadata, layers, slot_mapping=slots):
        for name in _LAB4_NAMES:
            got = sub["get_attention_context"](name)
            if not isinstance(got, (tuple, list)) or len(got) != 4:
                obs["layers"].append(repr(got)[:80])
            else:
                obs["layers"].append([next((label for o, label in known if g is o), "something else") for g in got])


def lab4_judge(obs, ref):
    for name, exp, got in zip(_LAB4_NAMES, ref["layers"], obs["layers"]):
        if not isinstance(got, list):
            raise LabCheckFailed("context of the named layer", f"get_attention_context({name!r})",
                                 f"a tuple {_LAB4_PARTS}", got, "return the four things a layer needs")
        for part, e, g in zip(_LAB4_PARTS, exp, got):
            if g != e:
                raise LabCheckFailed("context of the named layer", f"get_attention_context({name!r}), {part}", e, g,
                                     "every layer has its own KV cache and is looked up by its own name")
