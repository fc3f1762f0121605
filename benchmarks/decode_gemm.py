"""A decode step's GEMMs on the CPU: minivllm's panel kernel against oneDNN's packed linear, side by side.

Every linear weight of a Llama-shaped model (SmolLM2-135M's by default: 30 layers of qkv, o, gate_up and down,
then lm_head) multiplied by --rows rows, one weight after the other as a forward does, so the weights stream
from memory as they do in the engine (269 MB in bf16: more than any cache). minivllm's side is
`_C.linear_small_batch` on its own panels (csrc/cpu/gemm.c: in bf16 AVX512_BF16 dot products, or FMAs on
widened weights where the CPU has AVX-512 without them; AVX-512 FMAs in float32); oneDNN's is
`torch.ops.mkldnn._linear_pointwise` on `_reorder_linear_weight`'s packed weight, what the engine runs for
bigger batches. The two alternate round by round; every round prints, then the medians, their ratio and the
bandwidth the kernel reached (weight bytes / time). Outputs are compared too.

    python benchmarks/decode_gemm.py                              # bf16, rows 1 4 8 16 32 64 128, 5 rounds
    python benchmarks/decode_gemm.py --dtype float32 --rows 1 32
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
    p.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64, 128], help="rows of x (batch)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--layers", type=int, default=30)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--qkv", type=int, default=960, help="q + k + v output width (9 + 3 + 3 heads of 64)")
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--rounds", type=int, default=5)
    results.add_arguments(p)
    args = p.parse_args(argv)
    if min(args.rows) < 1 or args.rounds < 1 or args.layers < 1:
        p.error("rows, rounds and layers must be at least 1")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from minivllm import _C
    from minivllm.models.utils import small_batch_rows
    if not _C.available():
        sys.exit("the compiled CPU ops are not available here (a C compiler is needed; see the README)")
    dtype = getattr(torch, args.dtype)
    tile = _C.linear_bf16_tile()
    if dtype == torch.bfloat16 and tile == 0:
        print("note: this CPU lacks AVX-512, so the engine keeps bf16 GEMMs on oneDNN; timing the plain-C tile")
    elif dtype == torch.bfloat16 and tile == 1:
        print("note: this CPU lacks AVX512_BF16: the bf16 tile widens the weights to float32 and runs FMAs")
    torch.set_grad_enabled(False)
    gen = torch.Generator().manual_seed(0)
    h = args.hidden
    shapes = [(args.qkv, h), (h, h), (2 * args.intermediate, h), (h, args.intermediate)] * args.layers
    weights = [(torch.randn(n, k, generator=gen) * k**-0.5).to(dtype) for n, k in shapes + [(args.vocab, h)]]
    onednn = [torch.ops.mkldnn._reorder_linear_weight(w, 4096) for w in weights]
    panels = [_C.pack_linear_weight(w) for w in weights]
    megabytes = sum(w.numel() * w.element_size() for w in weights) / 1e6
    print(f"{len(weights)} weights, {megabytes:.0f} MB in {args.dtype}; {torch.get_num_threads()} threads; "
          f"ms per step, kernel/oneDNN (engine: kernel up to {small_batch_rows(dtype)} rows)")
    per_round, summary = [], {"weights MB": megabytes, "kernel up to rows": small_batch_rows(dtype)}
    for rows in args.rows:
        xs = {k: torch.randn(rows, k, generator=gen).to(dtype) for k in {w.shape[1] for w in weights}}

        def kernel():
            return [_C.linear_small_batch(xs[w.shape[1]], p, None, w.shape[0]) for w, p in zip(weights, panels)]

        def library():
            return [torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], p, None, "none", [], "")
                    for w, p in zip(weights, onednn)]
        diff = max((a.float() - b.float()).abs().max().item() for a, b in zip(kernel(), library()))
        ours, theirs = [], []
        for _ in range(args.rounds):
            for fn, times in ((kernel, ours), (library, theirs)):
                start = time.perf_counter()
                fn()
                times.append(time.perf_counter() - start)
        a, b = statistics.median(ours), statistics.median(theirs)
        rounds = " ".join(f"{x * 1e3:.1f}/{y * 1e3:.1f}" for x, y in zip(ours, theirs))
        print(f"{rows:4d} rows: {rounds} | median {a * 1e3:.2f} vs {b * 1e3:.2f} ms, oneDNN / kernel {b / a:.2f}x | "
              f"kernel {megabytes / 1e3 / a:.1f} GB/s of weights | max|diff| {diff:.1e}", flush=True)
        per_round += [{"rows": rows, "round": i + 1, "kernel ms": x * 1e3, "oneDNN ms": y * 1e3}
                      for i, (x, y) in enumerate(zip(ours, theirs))]
        summary[f"{rows} rows: oneDNN / kernel, median"] = b / a
        summary[f"{rows} rows: kernel GB/s"] = megabytes / 1e3 / a
    results.save(args, "decode_gemm", __file__, per_round, summary, argv=argv)


if __name__ == "__main__":
    main()
