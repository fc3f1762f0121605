"""One request decoding alone, against the memory floor measured in the same run.

A decode step of one request must read every weight once (the lm_head included: SmolLM2 ties it to the
embedding, so the whole vocabulary matrix is read each step), so its floor is weight bytes / memory bandwidth.
Each round measures both, back to back: the bandwidth as a torch sum over a buffer of the weights' size (best of
five; the same read-only stream a GEMV makes), and the step as the time of one request generating N + 1 tokens
minus the time of the same request generating 1 (that removes the prefill and the first token), divided by N.
Every round prints the step, the floor and their ratio; then the medians. The weights are counted as
benchmarks/throughput.py counts them (every layer's matmul weights and the lm_head; the embedding is read by one
row), in the dtype the engine runs.

    python benchmarks/one_request.py                    # bfloat16, 3 rounds of 128 tokens
    python benchmarks/one_request.py --dtype float32 --rounds 5
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import results  # noqa: E402
import throughput  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder (default: minivllm's converted SmolLM2)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--tokens", type=int, default=128, help="decode steps timed per round (default: 128)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds (default: 3)")
    p.add_argument("--enforce-eager", action="store_true", help="no CPU graphs (to see what replaying saves)")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if args.tokens < 1 or args.rounds < 1:
        p.error("--tokens and --rounds must be at least 1")
    import torch
    from transformers import AutoConfig

    from minivllm import LLM, SamplingParams
    from minivllm.models.loader import resolve_model

    folder = str(resolve_model(args.model))
    dtype = getattr(torch, args.dtype)
    nbytes = throughput.model_weights(AutoConfig.from_pretrained(folder)) * dtype.itemsize
    prompt = "The history of the printing press begins"
    llm = LLM(folder, dtype=args.dtype, max_model_len=64 + args.tokens, multiprocess=False,
              enable_prefix_caching=False, enforce_eager=args.enforce_eager)

    def generate(n: int) -> float:
        t = time.perf_counter()
        llm.generate([prompt], SamplingParams(temperature=0, max_tokens=n, ignore_eos=True), use_tqdm=False)
        return time.perf_counter() - t

    generate(8)  # warm-up: the first call's one-time costs are not a decode step's
    print(f"{args.dtype}, {nbytes / 1e6:.0f} MB of weights read per step, {args.tokens} steps a round", flush=True)
    rows = []
    for r in range(args.rounds):
        bandwidth = throughput.memory_bandwidth("cpu", nbytes)
        step = (generate(args.tokens + 1) - generate(1)) / args.tokens
        floor = nbytes / bandwidth
        rows.append({"round": r + 1, "bandwidth GB/s": bandwidth / 1e9, "floor ms": 1e3 * floor,
                     "step ms": 1e3 * step, "step / floor": step / floor, "tok/s": 1 / step})
        print(f"round {r + 1}: bandwidth {bandwidth / 1e9:5.1f} GB/s  floor {1e3 * floor:6.2f} ms  "
              f"step {1e3 * step:6.2f} ms ({1 / step:5.1f} tok/s)  step / floor {step / floor:.2f}x", flush=True)
    summary = {key + ", median": statistics.median(row[key] for row in rows)
               for key in ("bandwidth GB/s", "floor ms", "step ms", "step / floor", "tok/s")}
    model = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner.model
    summary.update({"dtype": args.dtype, "weight MB": nbytes / 1e6, "enforce_eager": args.enforce_eager,
                    "decode steps replayed as CPU graphs": getattr(model, "num_replays", 0)})
    print(f"median: step {summary['step ms, median']:.2f} ms against a floor of {summary['floor ms, median']:.2f} ms"
          f" = {summary['step / floor, median']:.2f}x")
    llm.shutdown()
    results.save(args, "one_request", __file__, argv=argv, rounds=rows, summary=summary)


if __name__ == "__main__":
    main()
