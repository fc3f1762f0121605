"""Mirrors vllm/benchmarks/kernels/ (benchmark_paged_attention.py, benchmark_reshape_and_cache_flash.py).

Times minivllm's Triton KV-cache write and decode attention against PyTorch
references and reports achieved bandwidth relative to a measured copy; leaves
out prefill attention timing, fp8 and CUDA-graph capture.

  python benchmarks/kernels.py                 # GPU: realistic sizes; CPU: tiny interpreter smoke run
  python benchmarks/kernels.py --device cpu --num-seqs 2 --context-len 20 --iters 1
"""

import argparse
import json
import math
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import results  # noqa: E402

GPU_DEFAULTS = dict(num_seqs=64, context_len=4096, num_q_heads=32, num_kv_heads=8,
                    head_size=128, block_size=16, iters=20)
CPU_DEFAULTS = dict(num_seqs=4, context_len=64, num_q_heads=4, num_kv_heads=2,
                    head_size=64, block_size=16, iters=2)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda or cpu (cpu runs Triton in interpreter mode; tiny defaults)")
    for name in GPU_DEFAULTS:
        p.add_argument("--" + name.replace("_", "-"), type=int, default=None,
                       help=f"default {GPU_DEFAULTS[name]} on cuda, {CPU_DEFAULTS[name]} on cpu")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    results.add_arguments(p)
    args = p.parse_args(argv)
    defaults = GPU_DEFAULTS if args.device.startswith("cuda") else CPU_DEFAULTS
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    return args


def timed(fn, device, iters):
    """Mean seconds per call after one warm-up call."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def copy_bandwidth(device, iters):
    """Bytes read + written per second for a large dst.copy_(src)."""
    n = (1 << 28) if device.startswith("cuda") else (1 << 24)  # 1 GiB / 64 MiB of fp32
    src = torch.randn(n, device=device)
    dst = torch.empty_like(src)
    t = timed(lambda: dst.copy_(src), device, max(iters, 3))
    return 2 * src.numel() * src.element_size() / t


def torch_paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale):
    """Reference: gather each seq's blocks via block_table, then matmul/softmax."""
    num_seqs, num_q_heads, head_size = q.shape  # [num_seqs, num_q_heads, head_size]
    _, block_size, num_kv_heads, _ = k_cache.shape
    k = k_cache[block_table.long()].flatten(1, 2)  # [num_seqs, max_blocks*block_size, num_kv_heads, head_size]
    v = v_cache[block_table.long()].flatten(1, 2)
    qg = q.view(num_seqs, num_kv_heads, num_q_heads // num_kv_heads, head_size)
    scores = torch.einsum("sgqd,skgd->sgqk", qg.float(), k.float()) * scale
    pos = torch.arange(k.shape[1], device=q.device)
    scores = scores.masked_fill(pos[None, None, None, :] >= seq_lens[:, None, None, None], float("-inf"))
    out = torch.einsum("sgqk,skgd->sgqd", scores.softmax(-1), v.float())
    return out.reshape(num_seqs, num_q_heads, head_size).to(q.dtype)


def main(argv=None):
    args = parse_args(argv)
    dev = args.device
    if not dev.startswith("cuda"):
        os.environ["TRITON_INTERPRET"] = "1"  # before the kernel modules are imported
    from minivllm import _custom_ops as ops

    dtype = torch.bfloat16 if dev.startswith("cuda") else torch.float32  # no bf16 in the interpreter
    S, L, Hq, Hkv, D, B = (args.num_seqs, args.context_len, args.num_q_heads,
                           args.num_kv_heads, args.head_size, args.block_size)
    elem = torch.tensor([], dtype=dtype).element_size()
    blocks_per_seq = math.ceil(L / B)
    num_blocks = S * blocks_per_seq
    block_table = torch.randperm(num_blocks, device=dev).to(torch.int32).view(S, blocks_per_seq)
    k_cache = torch.zeros(num_blocks, B, Hkv, D, dtype=dtype, device=dev)  # [num_blocks, B, Hkv, D]
    v_cache = torch.zeros_like(k_cache)
    copy_bw = copy_bandwidth(dev, args.iters)
    rows = []

    # (a) write the whole history of every sequence (S * L tokens) into the cache.
    pos = torch.arange(L, device=dev)
    slots = (block_table.long()[:, pos // B] * B + pos % B).flatten()  # [S * L]
    key = torch.randn(S * L, Hkv, D, dtype=dtype, device=dev)  # [S * L, Hkv, D]
    value = torch.randn_like(key)
    write_bytes = 2 * 2 * key.numel() * elem  # read + write, K and V
    t = timed(lambda: ops.reshape_and_cache_flash(key, value, k_cache, v_cache, slots), dev, args.iters)
    rows.append(("reshape_and_cache_flash (triton)", t, write_bytes))
    k_flat, v_flat = k_cache.view(-1, Hkv, D), v_cache.view(-1, Hkv, D)

    def torch_write():
        k_flat.index_copy_(0, slots, key)
        v_flat.index_copy_(0, slots, value)
    rows.append(("reshape_and_cache (torch index_copy_)", timed(torch_write, dev, args.iters), write_bytes))

    # (b) decode: one query token per sequence over L cached tokens.
    q = torch.randn(S, Hq, D, dtype=dtype, device=dev)  # [S, Hq, D]
    out = torch.empty_like(q)
    cu = torch.arange(S + 1, dtype=torch.int32, device=dev)
    seq_lens = torch.full((S,), L, dtype=torch.int32, device=dev)
    scale = 1.0 / math.sqrt(D)
    attn_bytes = 2 * S * L * Hkv * D * elem  # K and V read once
    t = timed(lambda: ops.unified_attention(q, k_cache, v_cache, out, cu, 1, seq_lens, L,
                                            scale, True, block_table), dev, args.iters)
    rows.append(("unified_attention (triton, paged)", t, attn_bytes))
    ref = torch_paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale)
    t = timed(lambda: torch_paged_decode(q, k_cache, v_cache, block_table, seq_lens, scale), dev, args.iters)
    rows.append(("torch paged (gather + matmul)", t, attn_bytes))
    k_dense = k_cache[block_table.long()].flatten(1, 2)[:, :L].transpose(1, 2).contiguous()  # [S, Hkv, L, D]
    v_dense = v_cache[block_table.long()].flatten(1, 2)[:, :L].transpose(1, 2).contiguous()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    t = timed(lambda: sdpa(q[:, :, None], k_dense, v_dense, scale=scale, enable_gqa=True), dev, args.iters)
    rows.append(("torch SDPA (dense, pre-gathered)", t, attn_bytes))

    err = ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()
    print(f"device={dev} dtype={str(dtype)[6:]} seqs={S} ctx={L} q_heads={Hq} kv_heads={Hkv} "
          f"head={D} block={B} iters={args.iters}"
          + ("  [Triton interpreter: timings are not meaningful]" if not dev.startswith("cuda") else ""))
    print(f"copy bandwidth: {copy_bw / 1e9:.1f} GB/s   triton-vs-torch decode rel err: {err:.1e}")
    print(f"{'kernel':40s} {'time ms':>10s} {'MB moved':>10s} {'GB/s':>9s} {'% copy':>8s}")
    for name, t, nbytes in rows:
        bw = nbytes / t
        print(f"{name:40s} {t * 1e3:10.3f} {nbytes / 1e6:10.2f} {bw / 1e9:9.2f} {100 * bw / copy_bw:7.1f}%")
    note = [] if dev.startswith("cuda") else ["Triton interpreter on the CPU: the timings are not meaningful"]
    args.note = list(args.note) + note
    results.save(args, "kernels", __file__, argv=argv, rounds=[
        {"kernel": name, "ms": t * 1e3, "MB moved": nbytes / 1e6, "GB/s": nbytes / t / 1e9,
         "fraction of copy": nbytes / t / copy_bw} for name, t, nbytes in rows], summary={
        "device": device_name(dev), "dtype": str(dtype)[6:], "copy GB/s": copy_bw / 1e9, "decode rel err": err})
    if args.json:
        shape = {k: getattr(args, k) for k in GPU_DEFAULTS}
        kernels = [dict(kernel=name, ms=t * 1e3, mb_moved=nbytes / 1e6, gb_per_s=nbytes / t / 1e9,
                        fraction_of_copy=nbytes / t / copy_bw) for name, t, nbytes in rows]
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, device_name=device_name(dev), dtype=str(dtype)[6:], **shape,
                           copy_gb_per_s=copy_bw / 1e9, decode_rel_err=err, kernels=kernels), f, indent=1)


def device_name(device):
    return torch.cuda.get_device_name() if device.startswith("cuda") else "cpu"


if __name__ == "__main__":
    main()
