"""Prefill attention on the CPU: minivllm's compiled kernel against torch's SDPA, side by side, one layer.

One request of --tokens query rows after --context cached positions (SmolLM2-135M's shape by default: 9 query
heads, 3 KV heads, head size 64; block size 16, blocks scattered in the pool). minivllm's `_C.paged_attention`
reads K/V in place through block_table (csrc/cpu/cpu_attn.c, the tiled path for 2 or more query rows);
torch's `scaled_dot_product_attention` gets K/V already gathered and contiguous (the copy not timed), causal
(`is_causal`, its flash path, without context; an explicit mask, its math path, with context). The two alternate round by round; every round prints, then the median and its ratio, with the
achieved GFLOP/s (4 x head_size x heads x the (query, key) pairs the causal mask keeps). Outputs are compared
too (max |difference|).

    python benchmarks/prefill_attention.py                       # 512, 1024, 2048 tokens; bf16 and fp32; 5 rounds
    python benchmarks/prefill_attention.py --tokens 256 --context 1792 --dtype bfloat16
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import results  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[512, 1024, 2048], help="query rows (default 512 1024 2048)")
    p.add_argument("--context", type=int, default=0, help="positions already in the cache before them (default 0)")
    p.add_argument("--dtype", nargs="+", default=["bfloat16", "float32"], choices=["bfloat16", "float32"])
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-size", type=int, default=64)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--min-seconds", type=float, default=0.3, help="time each side at least this long per round")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if args.heads % args.kv_heads or min(args.tokens) < 1 or args.context < 0 or args.rounds < 1:
        p.error("heads must be a multiple of kv-heads; tokens >= 1, context >= 0, rounds >= 1")
    return args


def build_case(args, num_tokens: int, dtype: torch.dtype):
    """The paged cache, its block table and the query, plus the same K/V gathered for SDPA."""
    gen = torch.Generator().manual_seed(0)
    seq_len, bs = args.context + num_tokens, args.block_size
    num_blocks = -(-seq_len // bs)
    shape = (num_blocks + 1, bs, args.kv_heads, args.head_size)  # block 0 unused, like the engine's null block
    key_cache, value_cache = (torch.randn(shape, generator=gen).to(dtype) for _ in range(2))
    block_table = (torch.randperm(num_blocks, generator=gen) + 1).to(torch.int32).unsqueeze(0)
    query = torch.randn(num_tokens, args.heads, args.head_size, generator=gen).to(dtype)
    slots = (block_table[0].long().repeat_interleave(bs) * bs + torch.arange(bs).repeat(num_blocks))[:seq_len]
    group = args.heads // args.kv_heads
    k, v = (c.view(-1, args.kv_heads, args.head_size)[slots].repeat_interleave(group, dim=1).transpose(0, 1)
            for c in (key_cache, value_cache))  # [heads, seq_len, head_size]: SDPA's layout, [1, ...] below
    mask = torch.ones(num_tokens, seq_len, dtype=torch.bool).tril(diagonal=args.context)
    return key_cache, value_cache, block_table, query, k[None].contiguous(), v[None].contiguous(), mask


def time_per_call(fn, min_seconds: float) -> float:
    fn()
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < min_seconds or calls < 3:
        fn()
        calls += 1
    return elapsed / calls


def main(argv=None) -> None:
    args = parse_args(argv)
    from minivllm import _C
    if not _C.available():
        sys.exit("the compiled CPU ops are not available here (a C compiler is needed; see the README)")
    torch.set_grad_enabled(False)
    scale = args.head_size ** -0.5
    print(f"one request, {args.heads} query / {args.kv_heads} KV heads, head {args.head_size}, block "
          f"{args.block_size}, context {args.context}; {torch.get_num_threads()} threads; ms per call, kernel/SDPA")
    per_round, summary = [], {}
    for dtype_name in args.dtype:
        dtype = getattr(torch, dtype_name)
        for num_tokens in args.tokens:
            key_cache, value_cache, block_table, query, k, v, mask = build_case(args, num_tokens, dtype)
            out = torch.empty_like(query)
            qsl = torch.tensor([0, num_tokens], dtype=torch.int32)
            seq_lens = torch.tensor([args.context + num_tokens], dtype=torch.int32)

            def kernel():
                _C.paged_attention(out, query, key_cache, value_cache, block_table, qsl, seq_lens, scale)

            q4 = query.transpose(0, 1)[None].contiguous()  # [1, heads, tokens, head_size]

            def sdpa():
                # without context the causal mask is SDPA's own (its flash path); with context an explicit mask
                return torch.nn.functional.scaled_dot_product_attention(
                    q4, k, v, attn_mask=None if args.context == 0 else mask,
                    is_causal=args.context == 0, scale=scale)
            kernel()
            diff = (out.float() - sdpa()[0].transpose(0, 1).float()).abs().max().item()
            ours, theirs = [], []
            for _ in range(args.rounds):
                ours.append(time_per_call(kernel, args.min_seconds))
                theirs.append(time_per_call(sdpa, args.min_seconds))
            pairs = int(mask.sum())
            flops = 4 * args.head_size * args.heads * pairs
            a, b = statistics.median(ours), statistics.median(theirs)
            rounds = " ".join(f"{x * 1e3:.2f}/{y * 1e3:.2f}" for x, y in zip(ours, theirs))
            print(f"{dtype_name:8s} {num_tokens:5d} tokens: {rounds} | median {a * 1e3:.2f} vs {b * 1e3:.2f} ms, "
                  f"SDPA / kernel {b / a:.2f}x | kernel {flops / a / 1e9:.0f} GFLOP/s | max|diff| {diff:.1e}")
            per_round += [{"dtype": dtype_name, "tokens": num_tokens, "round": i + 1, "kernel ms": x * 1e3,
                           "SDPA ms": y * 1e3} for i, (x, y) in enumerate(zip(ours, theirs))]
            summary[f"{dtype_name} {num_tokens} tokens: SDPA / kernel, median"] = b / a
            summary[f"{dtype_name} {num_tokens} tokens: kernel GFLOP/s"] = flops / a / 1e9
    results.save(args, "prefill_attention", __file__, per_round, summary, argv=argv)


if __name__ == "__main__":
    main()
