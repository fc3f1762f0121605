"""Tests for minivllm's Triton kernels (mirrors tests/kernels/attention/ in vLLM).

Checks the KV-cache write and unified paged attention kernels against an
independent dense float64 PyTorch reference; leaves out fp8/bf16 and perf.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module import

import math
import pathlib
import runpy
import subprocess
import sys

import pytest
import torch

from minivllm import _custom_ops as ops

REPO = pathlib.Path(__file__).resolve().parents[1]


def _cdiv(a, b):
    return -(-a // b)


def make_paged_batch(seqs, num_q_heads, num_kv_heads, head_size, block_size,
                     seed=0, pad_tokens=0):
    """seqs: list of (cached_len, q_len). Returns a dict with the cache already
    holding every seq's full history (cached + new tokens) at scattered blocks.
    Unused cache memory is NaN, so any stray read poisons the output."""
    g = torch.Generator().manual_seed(seed)
    seq_lens = [c + q for c, q in seqs]
    blocks_per_seq = [_cdiv(n, block_size) for n in seq_lens]
    num_blocks = sum(blocks_per_seq) + 3  # a few spare, never-used blocks
    perm = torch.randperm(num_blocks, generator=g).tolist()
    max_blocks = max(max(blocks_per_seq), 1) + 1  # a spare column, never read
    block_table = torch.zeros(len(seqs), max_blocks, dtype=torch.int32)
    shape = (num_blocks, block_size, num_kv_heads, head_size)
    k_cache = torch.full(shape, float("nan"))  # [num_blocks, block_size, num_kv_heads, head_size]
    v_cache = torch.full(shape, float("nan"))
    for s, nb in enumerate(blocks_per_seq):
        for j in range(nb):
            block_table[s, j] = perm.pop()
        for p in range(seq_lens[s]):  # plain indexing, one token at a time
            blk, off = int(block_table[s, p // block_size]), p % block_size
            k_cache[blk, off] = torch.randn(num_kv_heads, head_size, generator=g)
            v_cache[blk, off] = torch.randn(num_kv_heads, head_size, generator=g)
    q_lens = [q for _, q in seqs]
    cu = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    num_tokens = int(cu[-1]) + pad_tokens
    q = torch.randn(num_tokens, num_q_heads, head_size, generator=g)  # [num_tokens, num_q_heads, head_size]
    return dict(q=q, k=k_cache, v=v_cache, cu=cu, seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                block_table=block_table, max_q=max(q_lens), max_k=max(seq_lens))


def ref_attention(q, k_cache, v_cache, cu, seq_lens, block_table, scale, causal):
    """Dense float64 reference, one sequence at a time."""
    out = torch.full(q.shape, float("nan"), dtype=torch.float64)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    qpk = q.shape[1] // num_kv_heads
    for s in range(len(seq_lens)):
        start, end, L = int(cu[s]), int(cu[s + 1]), int(seq_lens[s])
        q_len = end - start
        if q_len == 0:
            continue
        keys = torch.stack([k_cache[int(block_table[s, p // block_size]), p % block_size]
                            for p in range(L)]).double()  # [L, num_kv_heads, head_size]
        vals = torch.stack([v_cache[int(block_table[s, p // block_size]), p % block_size]
                            for p in range(L)]).double()
        keys = keys.repeat_interleave(qpk, dim=1)  # [L, num_q_heads, head_size]
        vals = vals.repeat_interleave(qpk, dim=1)
        qs = q[start:end].double()  # [q_len, num_q_heads, head_size]
        scores = torch.einsum("qhd,khd->hqk", qs, keys) * scale  # [H, q_len, L]
        if causal:
            q_pos = torch.arange(L - q_len, L)[:, None]
            allowed = torch.arange(L)[None, :] <= q_pos  # [q_len, L]
            scores = scores.masked_fill(~allowed, float("-inf"))
        probs = scores.softmax(dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, vals)
    return out


def run_and_check(batch, causal=True):
    q = batch["q"]
    out = torch.full_like(q, float("nan"))  # [num_tokens, num_q_heads, head_size]
    scale = 1.0 / math.sqrt(q.shape[-1])
    ops.unified_attention(q, batch["k"], batch["v"], out, batch["cu"], batch["max_q"],
                          batch["seq_lens"], batch["max_k"], scale, causal, batch["block_table"])
    ref = ref_attention(q, batch["k"], batch["v"], batch["cu"], batch["seq_lens"],
                        batch["block_table"], scale, causal)
    n = int(batch["cu"][-1])
    assert torch.isfinite(out[:n]).all(), "some valid output element was not written"
    assert torch.isnan(out[n:]).all(), "padding rows must be left untouched"
    err = (out[:n].double() - ref[:n]).abs().max() / ref[:n].abs().max()
    assert err < 1e-4, f"relative error {err:.2e}"


# (cached_len, q_len): chunked prefill with history, fresh prefill,
# decodes (one right after a full block), and an idle seq with q_len 0.
MIXED = [(21, 7), (0, 11), (37, 1), (5, 1), (16, 1), (9, 0)]


@pytest.mark.parametrize("num_q_heads,num_kv_heads,head_size,block_size", [
    (2, 2, 64, 16),   # MHA
    (3, 1, 32, 32),   # GQA 3
    (8, 2, 128, 16),  # GQA 4, big head
    (4, 1, 80, 16),   # head size padded to 128 with masks
    (32, 2, 32, 16),  # GQA 16: one query token per program
    (24, 1, 96, 32),  # GQA 24 (> 16 rows, padded to 32), head size 96
])
def test_unified_attention_mixed_batch(num_q_heads, num_kv_heads, head_size, block_size):
    batch = make_paged_batch(MIXED, num_q_heads, num_kv_heads, head_size, block_size,
                             seed=head_size, pad_tokens=2)
    run_and_check(batch, causal=True)


def test_unified_attention_long_prefill_tiles():
    # q_len 23 with GQA 4 -> BLOCK_Q 4 -> 6 q tiles, last one partial.
    batch = make_paged_batch([(13, 23), (40, 1)], 4, 1, 32, 16, seed=1)
    run_and_check(batch, causal=True)


def test_unified_attention_non_causal():
    batch = make_paged_batch([(10, 6), (0, 5)], 2, 1, 32, 16, seed=2)
    run_and_check(batch, causal=False)


@pytest.mark.parametrize("block_size,head_size,num_kv_heads", [(16, 32, 3), (32, 64, 2)])
def test_reshape_and_cache_flash(block_size, head_size, num_kv_heads):
    g = torch.Generator().manual_seed(block_size)
    num_blocks, num_tokens = 6, 9
    kv = torch.full((2, 2, num_blocks, block_size, num_kv_heads, head_size), -7.0)  # poison
    key_cache, value_cache = kv[1, 0], kv[1, 1]  # non-contiguous views (layer 1)
    # key/value as strided slices of a fused qkv projection output.
    qkv = torch.randn(num_tokens, 3 * num_kv_heads * head_size, generator=g)
    key = qkv[:, num_kv_heads * head_size:2 * num_kv_heads * head_size].view(
        num_tokens, num_kv_heads, head_size)  # [num_tokens, num_kv_heads, head_size]
    value = qkv[:, 2 * num_kv_heads * head_size:].view(num_tokens, num_kv_heads, head_size)
    slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
    slots[[2, 5]] = -1  # padding tokens
    before = kv.clone()
    ops.reshape_and_cache_flash(key, value, key_cache, value_cache, slots)

    expected = before.clone()
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            expected[1, 0, slot // block_size, slot % block_size] = key[i]
            expected[1, 1, slot // block_size, slot % block_size] = value[i]
    assert torch.equal(kv, expected)  # intended slots written, everything else untouched
    assert torch.equal(kv[0], before[0])


def test_reshape_and_cache_rejects_fp8():
    k = torch.zeros(1, 1, 32)
    cache = torch.zeros(1, 16, 1, 32)
    with pytest.raises(NotImplementedError, match="kv_cache_dtype"):
        ops.reshape_and_cache_flash(k, k, cache, cache, torch.zeros(1, dtype=torch.long), "fp8")


def test_write_then_attend_end_to_end():
    """Scheduler-like step: cache history, write this step's K/V with the
    kernel (int64 slot_mapping with -1 padding), then attend."""
    num_q_heads, num_kv_heads, head_size, block_size = 6, 2, 32, 16  # GQA 3
    seqs = [(18, 5), (33, 1)]
    batch = make_paged_batch(seqs, num_q_heads, num_kv_heads, head_size, block_size, seed=3)
    kv = torch.full((1, 2) + tuple(batch["k"].shape), float("nan"))
    kv[0, 0], kv[0, 1] = batch["k"], batch["v"]
    ref_batch = dict(batch)
    new_k, new_v, slot_list = [], [], []
    for s, (cached, q_len) in enumerate(seqs):
        for p in range(cached, cached + q_len):  # pull the new tokens back out ...
            blk, off = int(batch["block_table"][s, p // block_size]), p % block_size
            new_k.append(batch["k"][blk, off])
            new_v.append(batch["v"][blk, off])
            slot_list.append(blk * block_size + off)
            kv[0, :, blk, off] = float("nan")  # ... and forget them in the cache
    new_k.append(torch.zeros(num_kv_heads, head_size))  # one padding token
    new_v.append(torch.zeros(num_kv_heads, head_size))
    slot_list.append(-1)
    ops.reshape_and_cache_flash(torch.stack(new_k), torch.stack(new_v), kv[0, 0], kv[0, 1],
                                torch.tensor(slot_list, dtype=torch.int64))
    batch["k"], batch["v"] = kv[0, 0], kv[0, 1]
    run_and_check(batch)
    assert torch.equal(kv[0, 0].nan_to_num(0), ref_batch["k"].nan_to_num(0))


def test_interpreter_env_set_by_package():
    """Without TRITON_INTERPRET (and no GPU), importing minivllm.kernels must
    turn the interpreter on, even when triton was imported first."""
    if torch.cuda.is_available():
        pytest.skip("a GPU is present; the interpreter is not forced")
    code = ("import triton, torch\n"
            "from minivllm import _custom_ops as ops\n"
            "import os; assert os.environ['TRITON_INTERPRET'] == '1'\n"
            "c = torch.zeros(1, 16, 1, 32); k = torch.ones(1, 1, 32)\n"
            "ops.reshape_and_cache_flash(k, k, c, c, torch.tensor([3]))\n"
            "assert c[0, 3].eq(1).all()\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, check=True)


def test_benchmark_smoke(monkeypatch, capsys, tmp_path):
    """Its result goes to the test's folder, never into benchmarks/results/ (the performance page's source)."""
    monkeypatch.setattr(sys, "argv", ["kernels.py", "--device", "cpu", "--num-seqs", "2",
                                      "--context-len", "20", "--iters", "1", "--results", str(tmp_path)])
    runpy.run_path(str(REPO / "benchmarks" / "kernels.py"), run_name="__main__")
    assert "unified_attention" in capsys.readouterr().out
    assert len(list(tmp_path.glob("kernels-*.json"))) == 1
