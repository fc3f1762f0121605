"""The compiled CPU ops (minivllm/_C.py, csrc/cpu/*.c) against PyTorch references, op by op.

Each op is run on shapes that reach its special cases (strided rows, tails of a panel or a row
tile, grouped query heads, head sizes with and without the vector path) and compared with the
plain PyTorch formula it replaces; paged attention (decodes and prefill chunks in one call) is compared
with float64 causal SDPA over the history gathered through the block table.
"""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, _C
from minivllm.csrc import build as ops_build
from minivllm.attention.backends.torch_attn import gather_history
from minivllm.models.layers import RotaryEmbedding, _rotate_half
from minivllm.utils import mem_utils
from minivllm.utils.mem_utils import HUGE_PAGE, move_into_one_buffer


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


def test_move_into_one_buffer_lays_tensors_back_to_back_in_order():
    holders = [SimpleNamespace(w=torch.randn(*shape).to(dtype)) for shape, dtype in
               [((3, 5), torch.bfloat16), ((1000, 7), torch.float32), ((1,), torch.bfloat16), ((64, 64), torch.float32)]]
    originals = [h.w.clone() for h in holders]
    moved = move_into_one_buffer(holders, "w")
    starts = [h.w.data_ptr() for h in holders]
    assert len({h.w.untyped_storage().data_ptr() for h in holders}) == 1  # one buffer
    assert starts[0] % HUGE_PAGE == 0 and all(s % 4096 == 0 for s in starts)
    assert all(a + h.w.nbytes <= b for a, b, h in zip(starts, starts[1:], holders))  # in order, none overlapping
    assert moved == sum(-(-h.w.nbytes // 4096) * 4096 for h in holders)
    assert all(torch.equal(h.w, o) and h.w.dtype == o.dtype for h, o in zip(holders, originals))


def test_zeros_on_huge_pages_are_zeros_of_the_shape_asked_for():
    kv = mem_utils.zeros((2, 3, 5, 16, 3, 64), torch.bfloat16, "cpu")  # 2 MiB and a bit: one huge page and more
    assert kv.shape == (2, 3, 5, 16, 3, 64) and kv.dtype == torch.bfloat16 and kv.is_contiguous()
    assert kv.data_ptr() % HUGE_PAGE == 0 and not kv.any()


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_the_engines_gemm_panels_sit_in_one_buffer_in_forward_order(tiny_llama_folder, dtype):
    if dtype == "bfloat16" and not _C.linear_bf16_tile():
        pytest.skip("bf16 panels are packed only where the C GEMM has an AVX-512 tile")
    llm = LLM(str(tiny_llama_folder), dtype=dtype, multiprocess=False, max_model_len=64)
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner.model
    names, panels = zip(*[(n, m.gemm_panels) for n, m in model.named_modules()
                          if getattr(m, "gemm_panels", None) is not None])
    assert names[:4] == tuple(f"model.layers.0.{p}" for p in ("self_attn.qkv_proj", "self_attn.o_proj",
                                                              "mlp.gate_up_proj", "mlp.down_proj"))
    assert len({p.untyped_storage().data_ptr() for p in panels}) == 1
    assert all(a.data_ptr() + a.nbytes <= b.data_ptr() for a, b in zip(panels, panels[1:]))
    llm.shutdown()


def reference_attention(query, key_cache, value_cache, block_table, query_start_loc, seq_lens, scale):
    """Causal SDPA per request over its history gathered through block_table, in float64: request r's rows
    query_start_loc[r] .. [r + 1] - 1 are the last of its seq_lens[r] positions, each seeing keys up to its own."""
    num_heads, kv_heads = query.shape[1], key_cache.shape[2]
    out = torch.zeros(query.shape, dtype=torch.float64)
    for r in range(len(seq_lens)):
        start, end, seq_len = int(query_start_loc[r]), int(query_start_loc[r + 1]), int(seq_lens[r])
        k, v = (gather_history(c, block_table[r], seq_len).double().repeat_interleave(num_heads // kv_heads, dim=1)
                for c in (key_cache, value_cache))  # [seq_len, num_heads, D]
        positions = torch.arange(seq_len - (end - start), seq_len)
        mask = torch.arange(seq_len)[None, :] <= positions[:, None]  # [q_len, seq_len]
        out[start:end] = F.scaled_dot_product_attention(query[start:end].double().transpose(0, 1), k.transpose(0, 1),
                                                        v.transpose(0, 1), attn_mask=mask, scale=scale).transpose(0, 1)
    return out


def attention_batch(q_lens, contexts, num_heads, kv_heads, head_size, block_size, dtype=torch.float32):
    """A step of requests with q_lens[r] query rows after contexts[r] positions already cached: their blocks
    scattered over the cache (block 0, the null block, unused), the queries a strided view of packed qkv rows
    with two padding rows after the last request, as the model hands them over."""
    torch.manual_seed(head_size * block_size + num_heads)
    seq_lens = [q + c for q, c in zip(q_lens, contexts)]
    blocks = [-(-s // block_size) for s in seq_lens]
    key_cache, value_cache = (torch.randn(sum(blocks) + 3, block_size, kv_heads, head_size).to(dtype) for _ in "kv")
    ids = (torch.randperm(sum(blocks) + 2) + 1).to(torch.int32)
    block_table = torch.zeros(len(q_lens), max(blocks) + 1, dtype=torch.int32)
    for r, n in enumerate(blocks):
        block_table[r, :n] = ids[sum(blocks[:r]):sum(blocks[:r]) + n]
    rows = sum(q_lens) + 2
    qkv = (torch.randn(rows, (num_heads + 2 * kv_heads) * head_size) * 3).to(dtype)  # * 3: peaked softmaxes
    query = qkv[:, :num_heads * head_size].view(rows, num_heads, head_size)
    query_start_loc = torch.tensor([0] + [sum(q_lens[:r + 1]) for r in range(len(q_lens))], dtype=torch.int32)
    return query, key_cache, value_cache, block_table, query_start_loc, torch.tensor(seq_lens, dtype=torch.int32)


# Query lengths 1 (a decode: the row path), 3 .. 100 (prefill chunks: the tile path), most after a cached
# context (chunked prefill: the first row sits past position 0), one prompt from position 0, all in one call.
STEP = ([1, 3, 17, 33, 100, 20], [37, 5, 70, 64, 21, 0])
ATTENTION_LAYOUTS = [
    (9, 3, 64, 16),  # SmolLM2: three query heads per KV head
    (9, 3, 64, 4),  # small blocks: one KV tile spans eight of them
    (9, 3, 64, 5),  # an odd block size: bf16 P.V takes positions in pairs, so each block ends on an unpaired one
    (4, 4, 32, 8),  # no grouping
    (16, 1, 80, 16),  # 16 query heads on one KV head; head_size 80, not a multiple of 32
    (10, 2, 80, 4),  # five heads per KV head: 19 tokens a tile, 95 rows padded to 96
    (6, 2, 72, 32),  # a head size the vector paths do not take: plain-C tiles and rows
    (8, 2, 128, 16),
]


# Forty decodes (and one chunk): enough for up to 20 threads to take a decode whole, every head in one item
# (cpu_attn.c's attend_decode_avx512); STEP's single decode takes an item per KV head.
DECODES = ([1] * 20 + [7] + [1] * 20,
           [(37 * i) % 150 + 1 for i in range(20)] + [30] + [(11 * i) % 90 for i in range(20)])


@pytest.mark.parametrize("step", [STEP, DECODES], ids=["mixed", "many-decodes"])
@pytest.mark.parametrize("num_heads,kv_heads,head_size,block_size", ATTENTION_LAYOUTS)
def test_paged_attention_matches_causal_sdpa_over_the_gathered_history(num_heads, kv_heads, head_size, block_size,
                                                                       step):
    query, key_cache, value_cache, block_table, qsl, seq_lens = attention_batch(*step, num_heads, kv_heads,
                                                                                head_size, block_size)
    want = reference_attention(query, key_cache, value_cache, block_table, qsl, seq_lens, head_size**-0.5)
    out = torch.full_like(query, float("nan"))
    _C.paged_attention(out, query, key_cache, value_cache, block_table, qsl, seq_lens, head_size**-0.5)
    n = int(qsl[-1])
    torch.testing.assert_close(out[:n], want[:n].float(), rtol=1e-5, atol=1e-5)
    assert out[n:].isnan().all()  # rows past the last request are left alone


def test_paged_attention_refuses_metadata_that_does_not_fit():
    query, key_cache, value_cache, block_table, qsl, seq_lens = attention_batch([2, 3], [0, 4], 4, 2, 32, 8)
    with pytest.raises(ValueError, match="starts be requests \\+ 1"):
        _C.paged_attention(torch.empty_like(query), query, key_cache, value_cache, block_table, qsl[1:], seq_lens, 1.0)


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
    for layout in ATTENTION_LAYOUTS[:5]:
        for step in (STEP, DECODES):
            test_paged_attention_matches_causal_sdpa_over_the_gathered_history(*layout, step=step)
    for m in (1, 9):
        test_linear_small_batch_matches_a_matmul(m, 70, 40, True)
    test_silu_and_mul_matches_torch_including_extreme_gates()
    test_rotary_embedding_in_place_on_views_of_qkv_equals_the_torch_formula()
