"""The labs' checks that need no engine run: a submission's function on hand-made inputs, judged against ours.

Each check is two halves: `*_observe(sub, llm, obs)` runs in the grading process and records what the
function returned, as plain data, in `obs`; `*_judge(obs, ref)` runs in the grader's own process and compares
it with `ref`, the same observation made with the engine's own function. `unit` marks an observe that needs no
engine (`llm` is None): the grader runs these first, and a failing one ends `check` before the model loads.
Cases come at several sizes (block sizes 4, 8 and 16, odd lengths), so a constant where a size belongs fails
here with a hint that names the size, not later in a token check.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.labs.errors import LabCheckFailed


def unit(observe):
    """Mark `observe` as a unit check: no engine is built for it."""
    observe.needs_engine = False
    return observe


# -- lab 8 ------------------------------------------------------------------------------------------------
_LAB8_CASES = [([1, 5, 0, 50], None), (None, [0.1, 0.5, 0.9, 1.0]), ([3, 10, 0, 20], [0.5, 0.3, 0.95, 0.7])]


@unit
def lab8_observe(sub, llm, obs):
    logits = torch.randn(4, 50, generator=torch.Generator().manual_seed(0))
    obs["kept"] = []
    for top_k, top_p in _LAB8_CASES:
        k = None if top_k is None else torch.tensor(top_k)
        p = None if top_p is None else torch.tensor(top_p)
        got = sub["apply_top_k_top_p"](logits.clone(), k, p)
        obs["kept"].append(torch.isfinite(got).tolist() if isinstance(got, torch.Tensor) else repr(got)[:60])


def lab8_judge(obs, ref):
    for (top_k, top_p), exp, got in zip(_LAB8_CASES, ref["kept"], obs["kept"]):
        if not isinstance(got, list):
            raise LabCheckFailed("masks = formula", f"top_k={top_k}, top_p={top_p}: return value",
                                 "a tensor of the logits' shape", got, "return the masked logits")
        for row in range(4):
            if exp[row] != got[row]:
                k = None if top_k is None else top_k[row]
                hint = ("k <= 0 means no top-k limit for that row" if k is not None and k <= 0 else
                        "keep the k best, then the fewest best tokens whose mass reaches top_p (the token that "
                        "crosses top_p stays); top-k first, then top-p on what is left")
                raise LabCheckFailed("masks = formula", f"top_k={top_k}, top_p={top_p}, row {row}, tokens kept",
                                     sum(exp[row]), sum(bool(x) for x in got[row]), hint)


# -- lab 5 ------------------------------------------------------------------------------------------------
# (block_size, number of blocks, slot_mapping, the physical blocks gather_blocks reads)
_LAB5_CASES = [(4, 6, [9, 10, 3, -1, 17], [[2, 0], [5, 1]]), (8, 5, [19, 4, -1, 38, 7, 12, 33], [[4, 0, 2]]),
               (16, 4, [33, 50, 5, -1, 16, 63, 2], [[3, 1], [0, 2]])]


@unit
def lab5_observe(sub, llm, obs):
    obs["cases"] = []
    for block_size, num_blocks, slots, physical in _LAB5_CASES:
        g = torch.Generator().manual_seed(block_size)
        key, value = torch.randn(len(slots), 2, 4, generator=g), torch.randn(len(slots), 2, 4, generator=g)
        cache = torch.zeros(2, num_blocks, block_size, 2, 4)
        sub["do_kv_cache_update"](None, key, value, cache, torch.tensor(slots))
        case = {"slots": [cache[kv].view(-1, 8).tolist() for kv in (0, 1)]}
        got = sub["gather_blocks"](cache[0], torch.tensor(physical))
        case["gather_shape"] = list(got.shape) if isinstance(got, torch.Tensor) else repr(got)[:60]
        case["gather"] = got.tolist() if isinstance(got, torch.Tensor) else None
        obs["cases"].append(case)


def lab5_judge(obs, ref):
    for (block_size, num_blocks, slots, physical), exp, got in zip(_LAB5_CASES, ref["cases"], obs["cases"]):
        for kv, name in ((0, "K"), (1, "V")):
            for slot in range(num_blocks * block_size):
                if got["slots"][kv][slot] != exp["slots"][kv][slot]:
                    tok = [i for i, s in enumerate(slots) if s == slot]
                    raise LabCheckFailed(
                        "write and read = formula", f"block_size {block_size}, slot_mapping {slots}: {name} cache, "
                        f"flat slot {slot} (block {slot // block_size}, offset {slot % block_size})",
                        f"token {tok[0]}'s {name}" if tok else "untouched (zeros)", "something else",
                        "token i goes to flat slot slot_mapping[i] of its own cache (K to kv_cache[0], V to "
                        "kv_cache[1]); a slot of -1 is padding and writes nothing")
        if got["gather_shape"] != exp["gather_shape"] or got["gather"] != exp["gather"]:
            raise LabCheckFailed("write and read = formula", f"block_size {block_size}: gather_blocks(cache, "
                                 f"{physical})", f"shape {tuple(exp['gather_shape'])}, the blocks {physical} whole",
                                 f"shape {got['gather_shape']}, other values",
                                 "logical block j of a row is physical block physical[row, j], taken whole "
                                 "([block_size, H, D] from the cache's own shape: no constant block size)")


# -- lab 3 ------------------------------------------------------------------------------------------------
_LAB3_NAMES = ("query_start_loc", "req_indices", "positions", "slot_mapping", "sampling", "logits_indices")
_LAB3_HINTS = {"query_start_loc": "where each request's rows start in the packed batch, then the total",
               "req_indices": "one entry per packed row: the request the row belongs to",
               "positions": "a request's rows continue its sequence where its KV cache ends",
               "slot_mapping": "a position's block is found in its own request's block_table row",
               "sampling": "only a request whose step reaches its last known token samples",
               "logits_indices": "lm_head runs on one row per sampling request: the last row of its step"}
_LAB3_TABLE = [[7, 2, 9, 4, 11, 12, 13, 14, 15, 16], [3, 8, 6, 10, 17, 18, 19, 20, 21, 22],  # wide enough
               [5, 1, 23, 24, 25, 26, 27, 28, 29, 30]]  # for a slip that reads block pos // 4 at block size 16
_LAB3_CASES = [("decode 13+1, chunk 4+4 of 11, new prompt 0+5", [1, 4, 5], [13, 4, 0], [14, 11, 5], 4),
               ("two decodes 6+1 and 9+1, chunk 0+3 of 7", [1, 1, 3], [6, 9, 0], [7, 10, 7], 4),
               ("block_size 8: decode 25+1, chunk 3+9 of 17, new prompt 0+11", [1, 9, 11], [25, 3, 0], [26, 17, 11],
                8),
               ("block_size 16: decode 37+1, chunk 16+9 of 33, new prompt 0+7", [1, 9, 7], [37, 16, 0], [38, 33, 7],
                16)]


def _lab3_slots(case, block_size: int) -> list[int]:
    """The slot formula on a case, at a given block size (to tell a constant block size from other slips)."""
    _, sched, computed, _, _ = case
    req = np.repeat(np.arange(len(sched)), sched)
    starts = np.concatenate(([0], np.cumsum(sched)))[:-1]
    pos = np.asarray(computed)[req] + np.arange(len(req)) - starts[req]
    table = np.asarray(_LAB3_TABLE)
    return (table[req, pos // block_size] * block_size + pos % block_size).tolist()


@unit
def lab3_observe(sub, llm, obs):
    """pack_indices on decodes, a middle prefill chunk and a whole new prompt (block sizes 4, 8 and 16)."""
    obs["cases"] = []
    for _, sched, computed, known, block_size in _LAB3_CASES:
        got = sub["pack_indices"](np.array(sched, dtype=np.int64), np.array(computed, dtype=np.int64),
                                  np.array(_LAB3_TABLE, dtype=np.int64), np.array(known, dtype=np.int64), block_size)
        if not isinstance(got, (tuple, list)) or len(got) != 6:
            obs["cases"].append(repr(got)[:80])
        else:
            obs["cases"].append([np.asarray(a).reshape(-1).tolist() for a in got])


def lab3_judge(obs, ref):
    for case, exp, got in zip(_LAB3_CASES, ref["cases"], obs["cases"]):
        label, block_size = case[0], case[4]
        if not isinstance(got, list):
            raise LabCheckFailed("indices = formula", f"{label}: return value", "a tuple of 6 arrays", got,
                                 "return " + ", ".join(_LAB3_NAMES))
        for name, e, g in zip(_LAB3_NAMES, exp, got):
            hint = _LAB3_HINTS[name]
            if name == "slot_mapping" and block_size != 4 and g == _lab3_slots(case, 4):
                hint = f"this case has block_size {block_size}: use the block_size argument, not a constant 4"
            if len(e) != len(g):
                raise LabCheckFailed("indices = formula", f"{label}: {name}, number of rows", len(e), len(g), hint)
            bad = next((i for i, (a, b) in enumerate(zip(e, g)) if a != b), None)
            if bad is not None:
                raise LabCheckFailed("indices = formula", f"{label}: {name}[{bad}]", e[bad], g[bad], hint)


# -- lab 4 ------------------------------------------------------------------------------------------------
_LAB4_NAMES = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn", "model.layers.2.self_attn.attn"]
_LAB4_PARTS = ("attn_metadata", "layer", "kv_cache", "slot_mapping")


@unit
def lab4_observe(sub, llm, obs):
    """get_attention_context inside two hand-made forward contexts (two steps) of three layers: which object
    each returned part is."""
    from types import SimpleNamespace
    from minivllm.forward_context import set_forward_context
    obs["layers"] = []
    for step in (1, 2):
        layers = {n: SimpleNamespace(layer_name=n, kv_cache=torch.zeros(i + 1)) for i, n in enumerate(_LAB4_NAMES)}
        slots = {n: torch.tensor([i, 5]) for i, n in enumerate(_LAB4_NAMES)}
        metadata = SimpleNamespace(num_actual_tokens=2)
        known = [(metadata, f"step {step}'s metadata"), (slots, f"step {step}'s whole slot_mapping dict")]
        for j, n in enumerate(_LAB4_NAMES):
            known += [(layers[n], f"step {step}, layer {j}'s layer"), (layers[n].kv_cache, f"step {step}, layer "
                      f"{j}'s kv_cache"), (slots[n], f"step {step}, layer {j}'s slot_mapping")]
        with set_forward_context(metadata, layers, slot_mapping=slots):
            for name in _LAB4_NAMES:
                got = sub["get_attention_context"](name)
                if not isinstance(got, (tuple, list)) or len(got) != 4:
                    obs["layers"].append(repr(got)[:80])
                else:
                    obs["layers"].append([next((label for o, label in known if g is o), "something else")
                                          for g in got])


def lab4_judge(obs, ref):
    names = [(step, n) for step in (1, 2) for n in _LAB4_NAMES]
    for (step, name), exp, got in zip(names, ref["layers"], obs["layers"]):
        where = f"step {step}: get_attention_context({name!r})"
        if not isinstance(got, list):
            raise LabCheckFailed("context of the named layer", where, f"a tuple {_LAB4_PARTS}", got,
                                 "return the four things a layer needs")
        for part, e, g in zip(_LAB4_PARTS, exp, got):
            if g != e:
                hint = ("read the forward context on every call: each step installs a new one" if
                        g.startswith("step 1") and step == 2 else "every layer has its own KV cache and slot_mapping, "
                        "each looked up by the layer's own name; the metadata is shared")
                raise LabCheckFailed("context of the named layer", f"{where}, {part}", e, g, hint)
