"""Async scheduling on and off, side by side: the offline LLM loop and the serving path (AsyncLLM).

Two engines with the same arguments but `async_scheduling`, each with its EngineCore in a child process,
measured in alternating order (on off, off on, ...) after one warm-up run each, every round printed. Offline:
`LLM.generate` of N random-token prompts, greedy, ignore_eos, max_tokens fixed. Serving: the same prompts
submitted at once to AsyncLLM (the engine under `minivllm serve`, without HTTP), each request streamed to its end.
Both report output tokens per second of wall time; the tokens of both engines are compared (they must be equal).

What to expect on a CPU: async scheduling hides the scheduler's and the output processing's time behind the
forward, which on a CPU is most of a step; it buys little there, and what it buys grows with the batch's Python
work per step against its forward time. On a GPU, where the forward is short, it is what keeps the device busy.

    python benchmarks/async_scheduling.py            # 32 requests x 64 tokens, 3 rounds
    python benchmarks/async_scheduling.py --quick    # a smoke test, not a measurement
"""
from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import results  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=32, help="requests in the workload (default: 32)")
    p.add_argument("--prompt-len", type=int, default=64, help="random prompt tokens per request (default: 64)")
    p.add_argument("--output-len", type=int, default=64, help="max_tokens of every request (default: 64)")
    p.add_argument("--model", default=None, help="model folder / .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--dtype", default="float32", help="float32 or bfloat16 (default: float32)")
    p.add_argument("--rounds", type=int, default=3, help="measured runs per engine and workload (default: 3)")
    p.add_argument("--quick", action="store_true", help="4 requests x 8 tokens, 1 round: a smoke test")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests, args.prompt_len, args.output_len, args.rounds = 4, 16, 8, 1
    return args


def offline(llm, prompts, params) -> tuple[float, list]:
    start = time.perf_counter()
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
    return time.perf_counter() - start, [o.outputs[0].token_ids for o in outs]


async def _serve(engine, prompts, params) -> list:
    async def one(i, prompt):
        final = None
        async for out in engine.generate({"prompt_token_ids": prompt}, params, f"bench-{i}-{time.monotonic_ns()}"):
            final = out
        return list(final.outputs[0].token_ids)
    return await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts)))


def serving(loop, engine, prompts, params) -> tuple[float, list]:
    start = time.perf_counter()
    tokens = loop.run_until_complete(_serve(engine, prompts, params))
    return time.perf_counter() - start, tokens


def main(argv=None) -> None:
    args = parse_args(argv)
    from minivllm import LLM, SamplingParams
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM

    params = SamplingParams(temperature=0, max_tokens=args.output_len, ignore_eos=True)
    kw = dict(model=args.model, dtype=args.dtype, max_model_len=args.prompt_len + args.output_len + 16)
    loop = asyncio.new_event_loop()
    engines = {}
    for on in (True, False):
        name = "async" if on else "sync"
        engines["offline", name] = LLM(**kw, async_scheduling=on)
        engines["serving", name] = AsyncLLM.from_engine_args(EngineArgs(**kw, async_scheduling=on))
    vocab = engines["offline", "sync"].llm_engine.hf_config.vocab_size
    rng = random.Random(0)
    prompts = [[rng.randrange(100, vocab - 100) for _ in range(args.prompt_len)] for _ in range(args.num_requests)]
    run = {"offline": lambda e: offline(e, prompts, params), "serving": lambda e: serving(loop, e, prompts, params)}
    rounds, same = [], True
    try:
        for workload in run:  # one warm-up each
            for name in ("async", "sync"):
                run[workload](engines[workload, name])
        for r in range(args.rounds):
            order = ("async", "sync") if r % 2 == 0 else ("sync", "async")
            for workload in run:
                seconds, tokens = {}, {}
                for name in order:
                    seconds[name], tokens[name] = run[workload](engines[workload, name])
                same &= tokens["async"] == tokens["sync"]
                n = args.num_requests * args.output_len
                row = {"round": r + 1, "workload": workload, "async_s": seconds["async"], "sync_s": seconds["sync"],
                       "async_tok_s": n / seconds["async"], "sync_tok_s": n / seconds["sync"],
                       "speedup": seconds["sync"] / seconds["async"]}
                rounds.append(row)
                print(f"round {r + 1} {workload:<8} async {row['async_tok_s']:8.1f} tok/s  sync "
                      f"{row['sync_tok_s']:8.1f} tok/s  async/sync {row['speedup']:.3f}x", flush=True)
    finally:
        for engine in engines.values():
            engine.shutdown()
        loop.close()
    summary = {}
    for workload in run:
        ratios = [row["speedup"] for row in rounds if row["workload"] == workload]
        summary[workload] = {"median_speedup": statistics.median(ratios), "min_speedup": min(ratios),
                             "max_speedup": max(ratios)}
        print(f"{workload:<8} async/sync median {summary[workload]['median_speedup']:.3f}x "
              f"(min {min(ratios):.3f}x, max {max(ratios):.3f}x over {len(ratios)} rounds)")
    summary["same_tokens"] = same
    print("same tokens with async scheduling on and off:", same)
    results.save(args, "async_scheduling", __file__, rounds=rounds, summary=summary, argv=argv)


if __name__ == "__main__":
    main()
