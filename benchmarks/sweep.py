"""How cost grows: minivllm's and vLLM's servers side by side, against concurrency and against prompt length.

Both OpenAI servers run at once (benchmarks/serve_vs_vllm.py starts them; each is idle while the other is
measured, the order alternates from point to point, and each point waits for an idle machine, idle.py).
Two sweeps, each point a fresh set of random-id prompts used by both servers, streamed, ignore_eos,
temperature 1:

- concurrency 1, 4, 16, 64 in flight: max(16, 2 x concurrency) prompts of `--prompt-len` tokens, `--output-len`
  tokens each; output tokens per second and time per output token (TPOT, p50).
- prompt length 64, 256, 1024, 2048 tokens at 4 in flight: 16 prompts, 16 output tokens each; time to first
  token (TTFT, p50).

The physical floor is drawn as a line and printed: a decode step at concurrency c must stream every weight once
(weight bytes / the memory bandwidth measured here) and do 2 x parameters x c FLOPs at the GEMM rate measured
here, so output tok/s <= c / max of the two; a prompt of L tokens needs 2 x parameters x L FLOPs before its first
token. Prints a table and writes the figure (default figures/sweep.png).

    python benchmarks/sweep.py                              # both servers, bf16
    python benchmarks/sweep.py --systems minivllm --quick   # a smoke test, no vLLM
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import results as result_files  # noqa: E402
import serve_vs_vllm  # noqa: E402
import throughput  # noqa: E402
from idle import wait_until_idle  # noqa: E402

CONCURRENCY = (1, 4, 16, 64)
PROMPT_LENS = (64, 256, 1024, 2048)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    serve_vs_vllm.add_server_args(p)
    p.add_argument("--prompt-len", type=int, default=128, help="prompt tokens in the concurrency sweep (default: 128)")
    p.add_argument("--output-len", type=int, default=64, help="output tokens in the concurrency sweep (default: 64)")
    p.add_argument("--out", default="figures/sweep.png", help="the figure (default: figures/sweep.png)")
    p.add_argument("--json", metavar="FILE", help="also write every point as JSON")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes, concurrency 1 and 4, prompts 16 and 32, the GEMM rate from 256 x 256")
    result_files.add_arguments(p)
    args = p.parse_args(argv)
    args.concurrency, args.prompt_lens = (CONCURRENCY, PROMPT_LENS) if not args.quick else ((1, 4), (16, 32))
    if args.quick:
        args.prompt_len, args.output_len = 8, 4
    # what serve_vs_vllm's helpers read
    args.max_model_len = max(args.prompt_lens) + max(args.output_len, 16) + 16
    return args


def points(args):
    """(sweep, x, prompts and max_tokens, concurrency), each point with its own random prompts."""
    import random
    rng = random.Random(0)

    def prompts(n, length, out):
        return [([rng.randrange(100, 49000) for _ in range(length)], out) for _ in range(n)]

    for c in args.concurrency:
        yield "concurrency", c, prompts(max(16, 2 * c) if not args.quick else 4, args.prompt_len, args.output_len), c
    for length in args.prompt_lens:
        yield "prompt_len", length, prompts(16 if not args.quick else 4, length, 16 if not args.quick else 2), 4


def floors(args, folder: str) -> dict:
    import torch
    from transformers import AutoConfig
    config = AutoConfig.from_pretrained(folder)
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[args.dtype]
    params = throughput.model_weights(config)
    weight_bytes = params * torch.finfo(dtype).bits // 8
    rate = throughput.matmul_rate("cpu", dtype, 256 if args.quick else None)
    bandwidth = throughput.memory_bandwidth("cpu", weight_bytes)
    return {"params": params, "weight_bytes": weight_bytes, "gemm_flops": rate, "bandwidth": bandwidth}


def draw(args, results: dict, floor: dict) -> None:
    from matplotlib.figure import Figure  # no pyplot, no global backend: as plots/ draws
    fig = Figure(figsize=(11, 4.2))
    left, right = fig.subplots(1, 2)
    p, rate, bw, wb = floor["params"], floor["gemm_flops"], floor["bandwidth"], floor["weight_bytes"]
    xs = list(args.concurrency)
    left.plot(xs, [c / max(wb / bw, 2 * p * c / rate) for c in xs], "k--", label="floor (bandwidth, GEMM rate)")
    for name, marker in (("minivllm", "o-"), ("vllm", "s-")):
        pts = [r for r in results.get(name, []) if r["sweep"] == "concurrency"]
        if pts:
            left.plot([r["x"] for r in pts], [r["tok_s"] for r in pts], marker, label=name)
    left.set(xscale="log", yscale="log", xlabel="requests in flight", ylabel="output tok/s",
             title=f"decode throughput ({args.prompt_len}-token prompts, {args.output_len} out)")
    left.set_xticks(xs, [str(x) for x in xs])
    ls = list(args.prompt_lens)
    right.plot(ls, [2 * p * length / rate for length in ls], "k--", label="floor (prefill FLOPs / GEMM rate)")
    for name, marker in (("minivllm", "o-"), ("vllm", "s-")):
        pts = [r for r in results.get(name, []) if r["sweep"] == "prompt_len"]
        if pts:
            right.plot([r["x"] for r in pts], [r["ttft_p50"] for r in pts], marker, label=name)
    right.set(xscale="log", yscale="log", xlabel="prompt tokens (4 in flight)", ylabel="TTFT p50 (s)",
              title="time to first token")
    right.set_xticks(ls, [str(x) for x in ls])
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"SmolLM2-135M, {args.dtype}, this machine: minivllm serve vs vLLM CPU build (OpenAI servers)")
    fig.tight_layout()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"figure written to {args.out}")


def main(argv=None) -> None:
    args = parse_args(argv)
    from minivllm.models.loader import resolve_model
    folder = str(resolve_model(args.model))
    names = args.systems.split(",")
    floor = floors(args, folder)
    print(f"floor inputs: {floor['weight_bytes'] / 1e6:.0f} MB of weights, {floor['bandwidth'] / 1e9:.1f} GB/s, "
          f"GEMM {floor['gemm_flops'] / 1e9:.0f} GFLOP/s ({args.dtype})", flush=True)
    servers, results = {}, {name: [] for name in names}
    try:
        for name in names:
            t = time.perf_counter()
            servers[name] = serve_vs_vllm.start_server(name, args, folder)
            print(f"{name} server ready in {time.perf_counter() - t:.0f} s", flush=True)
        model = {}
        for name, (_, base) in servers.items():
            with urllib.request.urlopen(base + "/v1/models") as r:
                model[name] = json.loads(r.read())["data"][0]["id"]
        print(f"{'sweep':<12}{'x':>6}  " + "  ".join(f"{n + ' tok/s':>15}{'TTFT p50':>9}{'TPOT ms':>8}" for n in names))
        for i, (sweep, x, work, concurrency) in enumerate(points(args)):
            row = {}
            for name in (names if i % 2 == 0 else names[::-1]):
                wait_until_idle()  # idle.py: the server measured before may still be winding down
                res = asyncio.run(serve_vs_vllm.run_load(servers[name][1], model[name], work, concurrency))
                results[name].append({"sweep": sweep, "x": x, **res})
                row[name] = res
            print(f"{sweep:<12}{x:>6}  " + "  ".join(f"{row[n]['tok_s']:>15.1f}{row[n]['ttft_p50']:>9.2f}"
                                                    f"{row[n]['tpot_ms']:>8.0f}" for n in names), flush=True)
    finally:
        for proc, _ in servers.values():
            proc.terminate()
            proc.wait(timeout=60)
    if args.json:
        Path(args.json).write_text(json.dumps({"floor": floor, "results": results}, indent=1))
    result_files.save(args, "sweep", __file__, argv=argv, summary=floor,
                      rounds=[{"system": n, **r} for n in names for r in results[n]])
    draw(args, results, floor)


if __name__ == "__main__":
    main()
