"""The compiled CPU ops (minivllm/_C.py, csrc/cpu/*.c) against PyTorch references, op by op.

Each op is run on shapes that reach its special cases (strided rows, tails of a panel or a row
tile, grouped query heads, head sizes with and without the vector path) and compared with the
plain PyTorch formula it replaces; decode attention is compared with a float64 gather + softmax.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minivllm import _C
from minivllm.csrc import build as ops_build
from minivllm.attention.backends.torch_attn import gather_history
from minivllm.models.layers import RotaryEmbedding, _rotate_half


@pytest.fixture(scope="module", autouse=True)
def compiled_ops():
    assert _C.available(), "the CPU ops did not build; see the warning logged by minivllm._C"


def test_rms_norm_matches_the_hf_formula_on_strided_rows():
    torch.manual_seed(0)
    x = torch.randn(37, 900)[:, :576] * 3  # rows 900 floats apart
    w = torch.randn(576)
    ref = w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5))
    torch.testing.assert_close(_C.rms_norm(x, w, 1e-5), ref, rtol=1e-6, atol=1e-6)


def test_rms_norm_takes_other_layouts_by_copying_them_to_rows():
    torch.manual_seed(0)
    x = torch.randn(64, 2, 5).permute(1, 2, 0)  # [2, 5, 64], each token's 64 values 10 floats apart
    w = torch.randn(64)
    out = _C.rms_norm(x, w, 1e-5)
    assert out.shape == (2, 5, 64)
    torch.testing.assert_close(out, w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5)),
                               rtol=1e-6, atol=1e-6)


def test_fused_add_rms_norm_adds_the_residual_then_normalises_in_place():
    torch.manual_seed(0)
    x, residual, w = torch.randn(5, 64), torch.randn(5, 64), torch.randn(64)
    total = x + residual
    _C.fused_add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(residual, total)  # the add itself is exact: one float32 add per element
    torch.testing.assert_close(x, w * (total * torch.rsqrt(total.pow(2).mean(-1, keepdim=True) + 1e-6)),
                               rtol=1e-6, atol=1e-6)


def test_silu_and_mul_matches_torch_including_extreme_gates():
    torch.manual_seed(0)
    x = torch.randn(9, 2 * 300) * 8
    x[0, :300] = torch.linspace(-120, 120, 300)  # past exp's clamp on both sides
    gate, up = x.chunk(2, dim=-1)
    torch.testing.assert_close(_C.silu_and_mul(x), F.silu(gate) * up, rtol=2e-6, atol=1e-6)


def test_rotary_embedding_in_place_on_views_of_qkv_equals_the_torch_formula():
    torch.manual_seed(0)
    rope = RotaryEmbedding(64, 512, {"rope_theta": 10000.0})
    qkv = torch.randn(23, 9 * 64 + 2 * 3 * 64)
    positions = torch.randint(0, 512, (23,))
    q, k = qkv[:, :576].view(23, 9, 64), qkv[:, 576:768].view(23, 3, 64)  # strided, as the model has them
    cos, sin = rope.cos_cache[positions].unsqueeze(1), rope.sin_cache[positions].unsqueeze(1)
    want_q, want_k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    v_before = qkv[:, 768:].clone()
    _C.rotary_embedding(positions, q, k, rope.cos_cache, rope.sin_cache)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)  # same multiplies and adds, same rounding
    assert torch.equal(qkv[:, 768:], v_before)  # V, beside them in the same rows, untouched


@pytest.mark.parametrize("m", [1, 3, 8, 9, 17, 33])
@pytest.mark.parametrize("n,k,bias", [(70, 40, True), (96, 576, False), (32, 1536, True)])
def test_linear_small_batch_matches_a_matmul(m, n, k, bias):
    torch.manual_seed(m * n)
    weight = torch.randn(n, k) / k**0.5
    b = torch.randn(n) if bias else None
    x = torch.randn(m, k + 5)[:, :k]  # strided rows
    out = _C.linear_small_batch(x, _C.pack_linear_weight(weight), b, n)
    torch.testing.assert_close(out, F.linear(x, weight, b), rtol=1e-5, atol=1e-5)


def reference_attention(query, key_cache, value_cache, block_table, kv_lens, scale):
    """Per query row: gather the first kv_lens[i] positions through block_table, softmax(q k^T * scale) v, float64."""
    num_heads, kv_heads = query.shape[1], key_cache.shape[2]
    out = torch.empty_like(query)
    for i in range(query.shape[0]):
        k = gather_history(key_cache, block_table[i], int(kv_lens[i])).double()  # [L, kv_heads, D]
        v = gather_history(value_cache, block_table[i], int(kv_lens[i])).double()
        k, v = (t.repeat_interleave(num_heads // kv_heads, dim=1) for t in (k, v))  # [L, num_heads, D]
        p = torch.softmax(torch.einsum("hd,lhd->hl", query[i].double(), k) * scale, dim=-1)
        out[i] = torch.einsum("hl,lhd->hd", p, v).float()
    return out


@pytest.mark.parametrize("num_heads,kv_heads,head_size,block_size", [
    (9, 3, 64, 16),  # SmolLM2: three query heads per KV head
    (4, 4, 32, 8),  # no grouping
    (16, 1, 80, 16),  # 16 query heads on one KV head: four groups of four
    (6, 2, 72, 32),  # a head size the vector path does not take
    (8, 2, 128, 16),
])
def test_paged_attention_reads_history_through_the_block_table(num_heads, kv_heads, head_size, block_size):
    torch.manual_seed(head_size)
    num_blocks, num_reqs = 64, 3
    key_cache = torch.randn(num_blocks, block_size, kv_heads, head_size)
    value_cache = torch.randn(num_blocks, block_size, kv_heads, head_size)
    # every request owns distinct, scattered physical blocks (block 0 is the null block)
    block_table = (torch.randperm(num_blocks - 1)[:num_reqs * 4].view(num_reqs, 4) + 1).to(torch.int32)
    # a step mixing a decode (request 2, 3 blocks of history), a prefill chunk with history (request 0,
    # positions block_size-1 .. block_size+2) and a prompt's first tokens (request 1, positions 0..2)
    req_index = torch.tensor([2, 0, 0, 0, 0, 1, 1, 1])
    kv_lens = torch.tensor([3 * block_size + 1, block_size, block_size + 1, block_size + 2, block_size + 3, 1, 2, 3],
                           dtype=torch.int32)
    query = torch.randn(len(req_index), num_heads, head_size)
    want = reference_attention(query, key_cache, value_cache, block_table[req_index], kv_lens, head_size**-0.5)
    # the queries sit at scattered rows of a bigger packed batch
    packed = torch.full((12, num_heads, head_size), float("nan"))
    token_index = torch.tensor([7, 0, 3, 9, 1, 5, 11, 2])
    packed[token_index] = query
    out = torch.full_like(packed, float("nan"))
    _C.paged_attention(out, packed, key_cache, value_cache, block_table, token_index, req_index, kv_lens,
                       int(kv_lens.max()), head_size**-0.5)
    torch.testing.assert_close(out[token_index], want, rtol=1e-5, atol=1e-5)
    untouched = torch.ones(12, dtype=torch.bool)
    untouched[token_index] = False
    assert out[untouched].isnan().all()  # rows that are not queries are left alone


def test_plan_queries_gives_each_token_its_request_and_causal_length():
    from minivllm.attention.backends.cpu_attn import plan_queries
    from minivllm.attention.backends.utils import AttentionMetadata
    md = AttentionMetadata(num_actual_tokens=4, max_query_len=3, query_start_loc=torch.tensor([0, 3, 4]),
                           max_seq_len=9, seq_lens=torch.tensor([3, 9]), block_table=torch.zeros(2, 1),
                           slot_mapping=torch.zeros(4), query_start_loc_cpu=[0, 3, 4], seq_lens_cpu=[3, 9])
    plan = plan_queries(md)
    assert plan.req_index.tolist() == [0, 0, 0, 1] and plan.kv_lens.tolist() == [1, 2, 3, 9]


def test_the_library_is_cached_and_keyed_by_its_source(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    path = ops_build.library_path()
    assert path.parent == tmp_path / "ops" and not path.exists()
    ops_build.build(path)
    assert path.exists() and list(path.parent.iterdir()) == [path]  # no half-written temporaries left


def test_switched_off_by_environment(monkeypatch):
    monkeypatch.setenv("MINIVLLM_CPU_KERNELS", "0")
    monkeypatch.setattr(_C, "_lib", None)
    monkeypatch.setattr(_C, "_tried", False)
    assert not _C.available() and not _C.usable(torch.zeros(1))


def test_reshape_and_cache_writes_each_token_to_its_slot_and_skips_padding():
    torch.manual_seed(0)
    qkv = torch.randn(6, 4 * 16 + 2 * 2 * 16)
    key, value = qkv[:, 64:96].view(6, 2, 16), qkv[:, 96:].view(6, 2, 16)  # strided views, as the model has them
    key_cache, value_cache = torch.zeros(2, 2, 5, 4, 2, 16)  # [num_blocks, block_size, kv_heads, head_size]
    slot_mapping = torch.tensor([3, 17, -1, 0, 12, 19])  # slot = block * 4 + offset; -1 is padding
    want_k, want_v = key_cache.clone(), value_cache.clone()
    valid = slot_mapping >= 0
    want_k.view(-1, 2, 16)[slot_mapping[valid]] = key[valid]
    want_v.view(-1, 2, 16)[slot_mapping[valid]] = value[valid]
    _C.reshape_and_cache(key, value, key_cache, value_cache, slot_mapping)
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)


def test_the_plain_c_paths_agree_too(tmp_path, monkeypatch):
    """Built without AVX-512, every file's scalar path serves; it must compute the same as the vector paths."""
    path = tmp_path / "generic.so"
    ops_build.build(path, extra_flags=("-mno-avx512f",))
    monkeypatch.setattr(_C, "_lib", _C.open_library(path))
    test_rms_norm_matches_the_hf_formula_on_strided_rows()
    test_fused_add_rms_norm_adds_the_residual_then_normalises_in_place()
    test_reshape_and_cache_writes_each_token_to_its_slot_and_skips_padding()
    for layout in [(9, 3, 64, 16), (16, 1, 80, 16)]:
        test_paged_attention_reads_history_through_the_block_table(*layout)
    for m in (1, 9):
        test_linear_small_batch_matches_a_matmul(m, 70, 40, True)
    test_silu_and_mul_matches_torch_including_extreme_gates()
    test_rotary_embedding_in_place_on_views_of_qkv_equals_the_torch_formula()
