"""bfloat16: each compiled op against a float64 (or PyTorch bf16) reference, then the engine against HF.

Tolerances are stated in bf16 units: rounding to bf16 loses at most 2**-8 of a value (half of its
last place), so an op that rounds once is held to rtol 2**-8 of the float64 result and one that
rounds twice (as HF's formula does) to 2**-7. Where our op performs PyTorch's own bf16 steps in
the same order (rotary, the residual add) it must give the same bits.

The engine is checked as vLLM's model tests check reduced precision (check_logprobs_close): two
greedy runs agree token for token until a position where they differ; there each side's token must
be among the other's top-5 logprobs, and nothing after it is compared.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from conftest import PROMPTS, check_logprobs_close
from minivllm import LLM, SamplingParams, _C, platforms
from minivllm.csrc import build as ops_build
from minivllm.models.layers import RotaryEmbedding, _rotate_half
from test_cpu_ops import ATTENTION_LAYOUTS, DECODES, STEP, attention_batch, reference_attention

BF = torch.bfloat16
MAX_TOKENS, TOP = 20, 5


@pytest.fixture(scope="module", autouse=True)
def compiled_ops():
    assert _C.available(), "the CPU ops did not build; see the warning logged by minivllm._C"


def hf_rms_norm(x, w, eps):  # HF LlamaRMSNorm in the input's dtype
    h = x.float()
    return w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def check_rms_norm():
    torch.manual_seed(0)
    x = (torch.randn(37, 900) * 3).to(BF)[:, :576]  # strided rows
    w = torch.randn(576).to(BF)
    want = w.double() * (x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5))
    out = _C.rms_norm(x, w, 1e-5)
    assert out.dtype == BF
    torch.testing.assert_close(out.double(), want, rtol=2**-7, atol=1e-6)
    assert (out != hf_rms_norm(x, w, 1e-5)).float().mean() < 0.01  # HF's bits but where its float sum rounds apart


def check_fused_add_rms_norm():
    torch.manual_seed(1)
    x, residual, w = torch.randn(5, 64).to(BF), torch.randn(5, 64).to(BF), torch.randn(64).to(BF)
    total = x + residual  # one bf16 add: the residual stream HF keeps
    _C.fused_add_rms_norm(x, residual, w, 1e-6)
    assert torch.equal(residual, total)
    want = w.double() * (total.double() * torch.rsqrt(total.double().pow(2).mean(-1, keepdim=True) + 1e-6))
    torch.testing.assert_close(x.double(), want, rtol=2**-7, atol=1e-6)


def check_silu_and_mul():
    torch.manual_seed(2)
    x = (torch.randn(9, 2 * 300) * 8).to(BF)
    x[0, :300] = torch.linspace(-120, 120, 300).to(BF)  # past exp's clamp on both sides
    gate, up = x.double().chunk(2, dim=-1)
    torch.testing.assert_close(_C.silu_and_mul(x).double(), F.silu(gate) * up, rtol=2**-7, atol=1e-6)


def check_rotary_embedding():
    torch.manual_seed(3)
    rope = RotaryEmbedding(64, 512, {"rope_theta": 10000.0}).to(BF)
    qkv = torch.randn(23, 9 * 64 + 2 * 3 * 64).to(BF)
    positions = torch.randint(0, 512, (23,))
    q, k = qkv[:, :576].view(23, 9, 64), qkv[:, 576:768].view(23, 3, 64)
    cos, sin = rope.cos_cache[positions].unsqueeze(1), rope.sin_cache[positions].unsqueeze(1)
    want_q, want_k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin  # HF's bf16 steps
    _C.rotary_embedding(positions, q, k, rope.cos_cache, rope.sin_cache)
    assert torch.equal(q, want_q) and torch.equal(k, want_k)


def check_reshape_and_cache():
    torch.manual_seed(4)
    key, value = torch.randn(6, 2, 16).to(BF), torch.randn(6, 2, 16).to(BF)
    key_cache, value_cache = torch.zeros(4, 8, 2, 16, dtype=BF), torch.zeros(4, 8, 2, 16, dtype=BF)
    slots = torch.tensor([9, 10, -1, 31, 8, 0])
    _C.reshape_and_cache(key, value, key_cache, value_cache, slots)
    keep = slots >= 0
    assert torch.equal(key_cache.view(-1, 2, 16)[slots[keep]], key[keep])
    assert torch.equal(value_cache.view(-1, 2, 16)[slots[keep]], value[keep])


def check_paged_attention(num_heads, kv_heads, head_size, block_size, step=STEP):
    """Decodes and prefill chunks in one call (test_cpu_ops.STEP) against float64 causal SDPA on the same bf16
    inputs. Where AVX512_BF16 runs P.V, each probability is rounded to bf16 first (as in PyTorch's own CPU flash
    attention), moving the output by at most 2**-8 of sum_p P_p |V_p| (SDPA over |V|); the output is rounded once
    more, at most 2**-8 of itself. The plain-C and float32-FMA builds keep P in float32 and meet it with room."""
    query, key_cache, value_cache, block_table, qsl, seq_lens = attention_batch(*step, num_heads, kv_heads, head_size,
                                                                                block_size, dtype=BF)
    want, want_abs = (reference_attention(query, key_cache, v, block_table, qsl, seq_lens, head_size**-0.5)
                      for v in (value_cache, value_cache.abs()))
    out = torch.full_like(query, float("nan"))
    _C.paged_attention(out, query, key_cache, value_cache, block_table, qsl, seq_lens, head_size**-0.5)
    n = int(qsl[-1])
    err, bound = (out[:n].double() - want[:n]).abs(), 2**-8 * (want_abs[:n] + want[:n].abs()) + 1e-5
    assert (err <= bound).all(), f"worst error {(err / bound).max().item():.2f} of the bound"
    assert out[n:].isnan().all()


def check_linear_small_batch():
    """Sums in float32 (vdpbf16ps adds a pair of exact products at a time), rounded once to bf16 after the bias:
    within 2**-8 of the float64 result, plus the float32 sums' own error (k adds of 2**-24 of |x| @ |W|^T).
    Every row count a 12-row tile leaves (1, 11, 12, 13, 25), an odd k (a zero partner for the last pair)."""
    torch.manual_seed(5)
    for n, k, bias in ((70, 41, True), (96, 576, False), (33, 1536, True)):
        weight = (torch.randn(n, k) * k**-0.5).to(BF)
        b = torch.randn(n).to(BF) if bias else None
        packed = _C.pack_linear_weight(weight)
        for m in (1, 11, 12, 13, 25):
            x = torch.randn(m, k + 3).to(BF)[:, :k]  # strided rows
            out = _C.linear_small_batch(x, packed, b, n)
            want = x.double() @ weight.double().T + (0 if b is None else b.double())
            bound = 2**-8 * want.abs() + k * 2**-24 * (x.double().abs() @ weight.double().abs().T) + 1e-6
            assert out.dtype == BF and ((out.double() - want).abs() <= bound).all(), (n, k, m)


KERNEL_CHECKS = [check_rms_norm, check_fused_add_rms_norm, check_silu_and_mul, check_rotary_embedding,
                 check_reshape_and_cache, check_linear_small_batch]


@pytest.mark.parametrize("check", KERNEL_CHECKS, ids=lambda c: c.__name__)
def test_bf16_op_against_its_reference(check):
    check()


@pytest.mark.parametrize("step", [STEP, DECODES], ids=["mixed", "many-decodes"])
@pytest.mark.parametrize("layout", ATTENTION_LAYOUTS)
def test_bf16_paged_attention_against_float64(layout, step):
    check_paged_attention(*layout, step=step)


@pytest.mark.parametrize("flags", [("-mno-avx512bf16",), ("-mno-avx512f",)], ids=["no-avx512bf16", "plain-c"])
def test_bf16_ops_without_the_instructions(flags, tmp_path, monkeypatch):
    """Built for a CPU without AVX512_BF16 (integer rounding in vectors) or without AVX-512 at all (the
    plain-C loops), every bf16 op must meet the same references."""
    path = tmp_path / "ops.so"
    ops_build.build(path, extra_flags=flags)
    monkeypatch.setattr(_C, "_lib", _C.open_library(path))
    for check in KERNEL_CHECKS:
        check()
    for layout in ATTENTION_LAYOUTS:
        for step in (STEP, DECODES):
            check_paged_attention(*layout, step=step)


def test_mixed_dtypes_are_refused_with_the_reason():
    with pytest.raises(ValueError, match="float32 or bfloat16 tensors of one dtype"):
        _C.rms_norm(torch.randn(2, 8).to(BF), torch.randn(8), 1e-6)
    assert not _C.usable(torch.zeros(2, dtype=BF), torch.zeros(2))


@pytest.mark.parametrize("checkpoint,flags,device,want", [
    ("float32", {"avx512_bf16"}, "cpu", "bfloat16"),
    ("float32", {"amx_bf16", "avx512f"}, "cpu", "bfloat16"),
    ("float32", {"avx2"}, "cpu", "float32"),
    ("float16", {"avx2"}, "cpu", "float32"),
    ("bfloat16", {"avx2"}, "cpu", "bfloat16"),
    (None, {"avx512_bf16"}, "cpu", "bfloat16"),
    ("float32", set(), "cuda", "bfloat16"),
])
def test_auto_dtype_resolves_as_vllm(checkpoint, flags, device, want, monkeypatch):
    monkeypatch.setattr(platforms, "cpu_flags", lambda: frozenset(flags))
    assert platforms.resolve_dtype("auto", checkpoint, device) == want
    assert platforms.resolve_dtype("float32", checkpoint, device) == "float32"  # an explicit dtype is kept


def test_auto_dtype_refuses_a_checkpoint_dtype_it_cannot_run():
    with pytest.raises(ValueError, match="pass dtype='float32'"):
        platforms.resolve_dtype("auto", "float8_e4m3fn", "cpu")


# ---- the engine in bf16 against HF ---------------------------------------------------------------

def hf_greedy_with_logprobs(folder, prompt_ids, dtype):
    """HF's greedy generate() per prompt: (tokens, top-5 token ids at each step)."""
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    runs = []
    with torch.inference_mode():
        for ids in prompt_ids:
            out = model.generate(torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
                                 do_sample=False, pad_token_id=2, output_logits=True, return_dict_in_generate=True)
            tops = [set(step[0].float().topk(TOP).indices.tolist()) for step in out.logits]
            runs.append((out.sequences[0, len(ids):].tolist(), tops))
    return runs


def engine_greedy_with_logprobs(prompt_ids, **engine_args):
    llm = LLM(multiprocess=False, **engine_args)
    params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS, ignore_eos=True, logprobs=TOP)
    outs = llm.generate(prompt_ids, params, use_tqdm=False)
    stats = llm.llm_engine.get_stats()
    llm.shutdown()
    assert stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1, "blocks leaked after the run"
    return [(o.outputs[0].token_ids, [set(step) for step in o.outputs[0].logprobs]) for o in outs], stats


@pytest.fixture(scope="module")
def prompt_ids(tokenizer):
    return [tokenizer.encode(p) for p in PROMPTS]


@pytest.fixture(scope="module")
def engine_bf16(prompt_ids):
    runs, _ = engine_greedy_with_logprobs(prompt_ids, dtype="bfloat16")
    return runs


def test_bf16_engine_is_close_to_hf_bf16_and_hf_fp32(smollm_folder, prompt_ids, engine_bf16):
    hf_bf16 = hf_greedy_with_logprobs(smollm_folder, prompt_ids, BF)
    hf_fp32 = hf_greedy_with_logprobs(smollm_folder, prompt_ids, torch.float32)
    same_as_hf_bf16 = check_logprobs_close(engine_bf16, hf_bf16, "minivllm bf16", "HF bf16")
    check_logprobs_close(engine_bf16, hf_fp32, "minivllm bf16", "HF fp32")
    assert same_as_hf_bf16 >= len(PROMPTS) // 2, "most prompts should agree with HF's bf16 on every token"


@pytest.mark.parametrize("engine_args", [{"max_num_batched_tokens": 5}, {"num_gpu_blocks_override": 8},
                                         {"attention_backend": "torch"}],
                         ids=["chunked", "preempted", "torch-attention"])
def test_bf16_engine_chunked_preempted_and_on_the_pytorch_path(prompt_ids, engine_bf16, engine_args):
    runs, stats = engine_greedy_with_logprobs(prompt_ids, dtype="bfloat16", **engine_args)
    if "num_gpu_blocks_override" in engine_args:
        assert stats["num_preemptions"] > 0
    check_logprobs_close(runs, engine_bf16, "this run", "the plain bf16 run")


def test_bf16_kv_cache_and_weights_are_bf16(prompt_ids):
    llm = LLM(multiprocess=False, dtype="auto" if platforms.cpu_has_native_bf16() else "bfloat16")
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner
    assert llm.llm_engine.config.dtype == "bfloat16"
    assert runner.kv_caches[0].dtype == BF and next(runner.model.parameters()).dtype == BF
    llm.shutdown()
