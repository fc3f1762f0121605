"""Article part 5 as one readable path: _custom_ops.py picks each op's implementation once, and says so.

From a backend name the engine's log line tells which KV write and paged read run, and they are the ones
that run: the "cpu" backend never slips into the PyTorch one per call, and asking for a backend that cannot
run is an error naming the fix. CustomOps pick their forward once. The C files follow vLLM's csrc/cpu
names, and _C.py's ctypes signatures are checked against the C prototypes, parsed from the source.
"""
from __future__ import annotations

import ctypes
import logging
import re
import tomllib
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from minivllm import LLM, SamplingParams, _C
from minivllm import _custom_ops as ops
from minivllm.attention.backends.cpu_attn import CPUAttentionImpl
from minivllm.attention.backends.torch_attn import TorchAttentionImpl
from minivllm.attention.backends.utils import AttentionMetadata
from minivllm.attention.selector import get_attn_backend_name, get_attn_impl
from minivllm.csrc import build as ops_build
from minivllm.models import utils as gemm_utils
from minivllm.models.layers import RMSNorm, SiluAndMul
from minivllm.models.utils import dispatch_cpu_unquantized_gemm

ROOT = Path(__file__).resolve().parents[1]
CPU_DIR = ROOT / "minivllm" / "csrc" / "cpu"


# ---- the C files and their ctypes signatures ------------------------------------------------------------------

C_TO_CTYPES = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "float": ctypes.c_float}


def c_signatures(text: str, definitions: bool) -> dict[str, tuple[list, object]]:
    """Every exported function of C `text` as ctypes types: prototypes `ret name(params);` or, with
    `definitions`, bodies `ret name(params) {` at the start of a line (static functions are not exported).
    Any pointer is c_void_p (the wrappers pass data_ptr()); an unknown type is kept as its C spelling."""
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    end = r"\s*\{" if definitions else r"\s*;"
    found = {}
    for ret, name, params in re.findall(r"^(\w+) (\w+)\(([^)]*)\)" + end, text, re.M):
        args = []
        for p in ([] if params.strip() == "void" else params.split(",")):
            spelled = " ".join(p.replace("const ", "").split()[:-1])  # drop the name: "int64_t *" or "float"
            args.append(ctypes.c_void_p if "*" in p else C_TO_CTYPES.get(spelled, spelled))
        found[name] = (args, None if ret == "void" else C_TO_CTYPES.get(ret, ret))
    return found


def mismatches(declared: dict, signatures: dict) -> list[str]:
    return [f"{name}: C {declared.get(name)} vs _C.py {signatures.get(name)}"
            for name in sorted(set(declared) | set(signatures)) if declared.get(name) != signatures.get(name)]


def test_ctypes_signatures_match_the_c_prototypes_and_definitions():
    declared = c_signatures((CPU_DIR / "ops.h").read_text(), definitions=False)
    defined = {}
    for source in ops_build.SOURCES:
        found = c_signatures(source.read_text(), definitions=True)
        assert not set(found) & set(defined), f"{source.name} defines a function another file defines"
        defined.update(found)
        assert '#include "ops.h"' in source.read_text(), f"{source.name} must include ops.h (the compiler checks)"
    assert len(declared) == 18 and not mismatches(declared, defined), mismatches(declared, defined)
    assert not mismatches(declared, _C.SIGNATURES), mismatches(declared, _C.SIGNATURES)


def test_the_signature_check_catches_a_changed_prototype():
    header = (CPU_DIR / "ops.h").read_text()
    changed = header.replace("int64_t x_stride, float eps, int dtype", "int64_t x_stride, double eps, int dtype")
    assert changed != header
    assert [m.split(":")[0] for m in mismatches(c_signatures(changed, False), _C.SIGNATURES)] == ["rms_norm"]
    fewer = header.replace("void silu_and_mul(void *out, const void *x, int64_t num_tokens, int64_t d, int dtype);",
                           "void silu_and_mul(void *out, const void *x, int64_t n, int dtype);")
    assert [m.split(":")[0] for m in mismatches(c_signatures(fewer, False), _C.SIGNATURES)] == ["silu_and_mul"]


def test_the_c_files_are_vllms_csrc_cpu_files_each_scalar_path_first():
    names = {"cache.c", "cpu_attn.c", "cpu_attn_avx512.c", "cpu_attn_avx512_bf16.c", "layernorm.c", "activation.c",
             "pos_encoding.c", "gemm.c", "shm.c"}
    assert {p.name for p in ops_build.SOURCES} == names == {p.name for p in CPU_DIR.glob("*.c")}
    assert {p.name for p in ops_build.HEADERS} == {p.name for p in CPU_DIR.glob("*.h")}
    for name in names - {"cpu_attn_avx512_bf16.c"}:
        assert (CPU_DIR / name).read_text().startswith("/* Mirror of vLLM's csrc/cpu/"), name
    assert (CPU_DIR / "cpu_attn_avx512_bf16.c").read_text().startswith("/* Counterpart of vLLM's csrc/cpu/")
    attn, gemm = (CPU_DIR / "cpu_attn.c").read_text(), (CPU_DIR / "gemm.c").read_text()
    # cpu_attn.c is the reading: the plain-C paths and the entry point, every vector path in its own file
    assert "ALWAYS_INLINE void attend_generic(" in attn and "_mm512" not in attn
    assert gemm.index("#ifndef __AVX512F__") < gemm.index("__m512 acc[ROWS][2];")
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert {"csrc/cpu/*.c", "csrc/cpu/*.h"} <= set(package_data["minivllm"])


# ---- the attention backend: chosen once, logged once, and the one that runs ------------------------------------

def test_asking_for_a_backend_that_cannot_run_is_an_error_naming_the_fix(monkeypatch, tiny_llama_folder):
    monkeypatch.delenv("MINIVLLM_ATTENTION_BACKEND", raising=False)
    assert _C.available()
    assert get_attn_backend_name(None, "cpu", torch.float32) == "cpu"
    assert get_attn_backend_name(None, "cpu", "bfloat16") == "cpu"
    assert get_attn_backend_name(None, "cpu", torch.float16) == "torch"  # the kernels do not take float16
    with pytest.raises(ValueError, match="not device='cpu', dtype=torch.float16.*attention_backend='torch'"):
        get_attn_backend_name("cpu", "cpu", torch.float16)
    with pytest.raises(ValueError, match="not device='cuda'\\."):
        get_attn_backend_name("cpu", "cuda")
    monkeypatch.setattr(_C, "_lib", None)  # as without a compiler, or with MINIVLLM_CPU_KERNELS=0
    monkeypatch.setattr(_C, "_tried", True)
    assert get_attn_backend_name(None, "cpu") == "torch"
    with pytest.raises(ValueError, match="switched off or did not build.*attention_backend='torch'"):
        get_attn_backend_name("cpu", "cpu")
    with pytest.raises(ValueError, match="attention_backend='torch'"):
        LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, attention_backend="cpu")


def _metadata(seq_lens: list[int], query_lens: list[int]) -> AttentionMetadata:
    qsl = [0]
    for n in query_lens:
        qsl.append(qsl[-1] + n)
    return AttentionMetadata(num_actual_tokens=qsl[-1], max_query_len=max(query_lens),
                             query_start_loc=torch.tensor(qsl, dtype=torch.int32), max_seq_len=max(seq_lens),
                             seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
                             block_table=torch.tensor([[1, 2], [3, 4]], dtype=torch.int32),
                             slot_mapping=torch.tensor([16, 17, 50]), query_start_loc_cpu=qsl, seq_lens_cpu=seq_lens)


def test_the_cpu_backend_never_falls_back_to_the_pytorch_one():
    assert not issubclass(CPUAttentionImpl, TorchAttentionImpl)
    impl, layer = CPUAttentionImpl(), type("Layer", (), {"scale": 0.125})()
    md = _metadata(seq_lens=[2, 3], query_lens=[2, 1])  # a 2-token prompt and a decode at position 2
    kv_cache = torch.zeros(2, 5, 16, 2, 64)  # [2, num_blocks, block_size, num_kv_heads, head_size]
    key, value = torch.randn(3, 2, 64), torch.randn(3, 2, 64)
    impl.do_kv_cache_update(key, value, kv_cache, md.slot_mapping)
    assert torch.equal(kv_cache[0, 1, 0], key[0]) and torch.equal(kv_cache[1, 3, 2], value[2])
    query = torch.randn(4, 3, 64).transpose(0, 1)  # [3, 4, 64] whose heads are not back to back
    with pytest.raises(ValueError, match="contiguous heads.*'torch' attention backend takes any layout"):
        impl.forward(layer, query, key, value, kv_cache, md, torch.empty(3, 4, 64))
    with pytest.raises(ValueError, match="float32 or bfloat16.*attention_backend='torch'"):
        impl.do_kv_cache_update(key.half(), value.half(), kv_cache.half(), md.slot_mapping)


@pytest.mark.parametrize("backend", ["cpu", "torch", "triton"])
def test_get_attn_impl_logs_the_write_and_read_it_runs(backend, monkeypatch):
    records = []
    logger = logging.getLogger("minivllm")
    handler = logging.Handler()
    handler.emit = records.append
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(handler)
    try:
        impl = get_attn_impl(backend)
    finally:
        logger.removeHandler(handler)
    write, read = {"cpu": ("C reshape_and_cache (csrc/cpu/cache.c)", "C paged_attention (csrc/cpu/cpu_attn.c)"),
                   "torch": ("PyTorch index_copy_ by slot_mapping", "PyTorch gather by block_table + SDPA"),
                   "triton": ("Triton reshape_and_cache_flash", "Triton unified_attention")}[backend]
    lines = [r.getMessage() for r in records]
    assert len(lines) == 1 and lines[0].startswith(f"attention backend {backend}: KV write = {write}")
    assert f"paged read = {read}" in lines[0]
    assert type(impl).__name__ == {"cpu": "CPUAttentionImpl", "torch": "TorchAttentionImpl",
                                   "triton": "TritonAttentionImpl"}[backend]


@pytest.mark.parametrize("backend", ["cpu", "torch"])
def test_the_engine_logs_once_and_runs_what_it_logged(backend, tiny_llama_folder, monkeypatch, capsys):
    counts = {"C write": 0, "C read": 0, "torch write": 0, "torch read": 0}

    def spy(owner, name, key):
        real = getattr(owner, name)

        def counted(*args, **kwargs):
            counts[key] += 1
            return real(*args, **kwargs)
        monkeypatch.setattr(owner, name, counted)

    spy(_C, "reshape_and_cache", "C write"), spy(_C, "paged_attention", "C read")
    spy(TorchAttentionImpl, "do_kv_cache_update", "torch write"), spy(TorchAttentionImpl, "forward", "torch read")
    monkeypatch.setenv("MINIVLLM_LOGGING_LEVEL", "INFO")
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, attention_backend=backend,
              max_num_batched_tokens=4)  # a 6-token prompt is chunked: steps of 4 + 2, then decodes
    try:
        llm.generate([{"prompt_token_ids": [1, 2, 3, 4, 5, 6]}, {"prompt_token_ids": [7, 8]}],
                     SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    finally:
        llm.shutdown()
    lines = [line for line in capsys.readouterr().err.splitlines() if "KV write = " in line]
    assert len(lines) == 1 and f"attention backend {backend}: KV write = " in lines[0], lines
    ran, idle = ("C", "torch") if backend == "cpu" else ("torch", "C")
    assert counts[f"{ran} write"] == counts[f"{ran} read"] > 0 and counts[f"{ran} read"] % 2 == 0  # 2 layers
    assert counts[f"{idle} write"] == counts[f"{idle} read"] == 0, counts


# ---- CustomOps and the CPU GEMM: picked once ------------------------------------------------------------------

def test_a_custom_op_picks_its_forward_once_and_again_after_a_cast(monkeypatch):
    cpu = torch.device("cpu")
    assert ops.choose_custom_op_forward(cpu, torch.float32) == ops.choose_custom_op_forward(cpu, torch.bfloat16) \
        == "forward_cpu"
    assert ops.choose_custom_op_forward(cpu, torch.float16) == "forward_native"
    assert ops.choose_custom_op_forward(torch.device("cuda"), torch.float32) == "forward_native"
    calls = []
    real = _C.rms_norm
    monkeypatch.setattr(_C, "rms_norm", lambda *a: calls.append(1) or real(*a))
    norm = RMSNorm(64, 1e-6).to(torch.float16)
    x = torch.randn(3, 64)
    torch.testing.assert_close(norm(x.half()), norm.forward_native(x.half()))
    assert norm.forward_method == "forward_native" and not calls
    norm.float()  # cast: choose again
    assert norm.forward_method is None
    torch.testing.assert_close(norm(x), norm.forward_native(x), rtol=1e-6, atol=1e-6)
    assert norm.forward_method == "forward_cpu" and len(calls) == 1
    with pytest.raises(ValueError, match="float32 or bfloat16"):  # chosen: no silent switch per call
        norm(x.half())


def test_a_custom_op_without_the_library_runs_pytorch_and_says_so_once(monkeypatch):
    monkeypatch.setattr(_C, "_lib", None)
    monkeypatch.setattr(_C, "_tried", True)
    ops._log_native_once.cache_clear()
    records = []
    logger = logging.getLogger("minivllm")
    handler = logging.Handler()
    handler.emit = records.append
    monkeypatch.setattr(logger, "level", logging.INFO)
    logger.addHandler(handler)
    try:
        x = torch.randn(2, 8)
        for _ in range(3):
            act = SiluAndMul()
            assert torch.equal(act(x), act.forward_native(x)) and act.forward_method == "forward_native"
    finally:
        logger.removeHandler(handler)
        ops._log_native_once.cache_clear()
    assert [r.getMessage() for r in records] == [
        "RMSNorm, SiluAndMul and the rotary embedding run their PyTorch forward_native: the compiled CPU ops are off"]


def test_the_cpu_gemm_is_picked_by_rows_in_one_place(monkeypatch):
    """dispatch_cpu_unquantized_gemm packs a layer once; its cpu_linear runs the C GEMM up to small_batch_rows
    rows and oneDNN above, and drops the unpacked weight only where asked (vLLM's remove_weight)."""
    torch.manual_seed(0)
    linear = torch.nn.Linear(40, 70)
    panels = ops.pack_small_batch_linear(linear.weight)
    # bf16 gets panels only where an AVX-512 tile is built (dot products or FMAs); elsewhere bf16 stays on oneDNN
    assert panels is not None
    assert (ops.pack_small_batch_linear(linear.weight.bfloat16()) is not None) == (_C.linear_bf16_tile() > 0)
    calls = []
    real = _C.linear_small_batch
    monkeypatch.setattr(_C, "linear_small_batch", lambda *a: calls.append(a[0].shape[0]) or real(*a))
    weight, bias = linear.weight.detach().clone(), linear.bias.detach()
    dispatch_cpu_unquantized_gemm(linear, remove_weight=True)
    assert linear.weight.numel() == 0 and linear.gemm_panels is not None
    for rows in (1, gemm_utils.SMALL_BATCH, gemm_utils.SMALL_BATCH + 1):
        x = torch.randn(rows, 40)
        torch.testing.assert_close(linear.cpu_linear(x, linear.weight, bias), F.linear(x, weight, bias),
                                   rtol=1e-5, atol=1e-5)
    assert calls == [1, gemm_utils.SMALL_BATCH]  # the bigger batch went to oneDNN
    if _C.linear_bf16_tile() > 0:  # bf16: up to BF16_SMALL_BATCH rows (fewer where AMX serves oneDNN)
        layer, calls[:] = torch.nn.Linear(40, 70, bias=False).bfloat16(), []
        weight = layer.weight.detach().clone()
        dispatch_cpu_unquantized_gemm(layer, remove_weight=False)
        assert torch.equal(layer.weight, weight)
        for rows in (1, gemm_utils.BF16_SMALL_BATCH, gemm_utils.BF16_SMALL_BATCH + 1):
            x = torch.randn(rows, 40).bfloat16()
            torch.testing.assert_close(layer.cpu_linear(x, layer.weight, None), x @ weight.T, rtol=2**-7, atol=1e-2)
        assert calls == [1, gemm_utils.BF16_SMALL_BATCH]


def test_a_weight_the_cpu_gemms_do_not_take_runs_f_linear_and_stays(monkeypatch):
    layer = torch.nn.Linear(8, 4).half()
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.cpu_linear is F.linear and layer.weight.shape == (4, 8)
    monkeypatch.setenv("MINIVLLM_CPU_PACKED_LINEAR", "0")
    layer = torch.nn.Linear(8, 4)
    dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert layer.cpu_linear is F.linear and layer.weight.shape == (4, 8) and not hasattr(layer, "gemm_panels")