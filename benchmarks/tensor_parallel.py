"""Tensor parallelism on this CPU: the same greedy workload at tensor_parallel_size 1 and N, side by side.

Both engines are built first (in-process EngineCore; TP=N adds N worker processes) and warmed up, then
measured in alternating order (1 N, N 1, ...), so a noisy neighbour hits both alike; every round prints,
with its ratio. Workload: the eight prompts of the parity tests, all submitted at once, greedy,
`--output-len` tokens each (ignore_eos). On a machine with few cores TP=N is expected to be slower: each
rank gets cores // N threads, and every layer adds two all-reduces through gloo (TCP on loopback) on the
critical path. It is there to learn the mechanism; it pays where one device (or socket) is the limit.

    python benchmarks/tensor_parallel.py                 # SmolLM2-135M, TP 1 vs 3, 64 tokens, 3 rounds
    python benchmarks/tensor_parallel.py --quick         # a smoke test, not a measurement
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import results  # noqa: E402

PROMPTS = ["Once upon a time", "The capital of France is", "Hi there, how are you today?",
           "Write a haiku about the sea.", "1, 2, 3, 4, 5,", "def fibonacci(n):",
           "The quick brown fox jumps over the lazy dog. The quick brown fox", "My favourite colour is"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model folder / .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--tensor-parallel-size", type=int, default=3, help="N, compared with 1 (default: 3)")
    p.add_argument("--output-len", type=int, default=64, help="greedy tokens per prompt (default: 64)")
    p.add_argument("--rounds", type=int, default=3, help="measured runs per engine, after a warm-up (default: 3)")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16 (default: float32)")
    p.add_argument("--quick", action="store_true", help="2 tokens, 1 round: a smoke test, not a measurement")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.output_len, args.rounds = 2, 1
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    from minivllm import LLM, SamplingParams
    greedy = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    n = args.tensor_parallel_size
    print(f"cores available: {len(os.sched_getaffinity(0))}; TP=1 vs TP={n}; {len(PROMPTS)} prompts x "
          f"{args.output_len} greedy tokens; {args.dtype}", flush=True)
    engines = {}
    for tp in (1, n):
        start = time.perf_counter()
        engines[tp] = LLM(args.model, tensor_parallel_size=tp, multiprocess=False, dtype=args.dtype,
                          max_model_len=512)
        print(f"TP={tp}: engine ready in {time.perf_counter() - start:.1f} s", flush=True)
        engines[tp].generate(PROMPTS, SamplingParams(temperature=0, max_tokens=2), use_tqdm=False)  # warm-up
    tokens = {}
    ratios, per_round = [], []
    for r in range(args.rounds):
        seconds = {}
        for tp in ((1, n) if r % 2 == 0 else (n, 1)):
            start = time.perf_counter()
            outs = engines[tp].generate(PROMPTS, greedy, use_tqdm=False)
            seconds[tp] = time.perf_counter() - start
            tokens[tp] = [o.outputs[0].token_ids for o in outs]
        ratios.append(seconds[n] / seconds[1])
        generated = len(PROMPTS) * args.output_len
        per_round.append({"round": r + 1, "TP=1 s": seconds[1], f"TP={n} s": seconds[n],
                          f"TP={n} / TP=1": ratios[-1]})
        print(f"round {r + 1}: TP=1 {seconds[1]:.2f} s ({generated / seconds[1]:.0f} tok/s), TP={n} "
              f"{seconds[n]:.2f} s ({generated / seconds[n]:.0f} tok/s): TP={n} takes {ratios[-1]:.2f}x TP=1's time",
              flush=True)
    same = sum(a == b for a, b in zip(tokens[1], tokens[n]))
    print(f"ratios (TP={n} / TP=1) per round: {', '.join(f'{x:.2f}' for x in ratios)}")
    print(f"prompts with identical greedy tokens: {same} of {len(PROMPTS)}")
    results.save(args, "tensor_parallel", __file__, per_round, argv=argv, summary={
        f"TP={n} / TP=1 time, median": statistics.median(ratios),
        "prompts with identical greedy tokens": f"{same} of {len(PROMPTS)}"})
    for llm in engines.values():
        llm.shutdown()


if __name__ == "__main__":
    main()
