"""Prefix caching: the same shared-prefix workload with enable_prefix_caching on and off, side by side.

Workload (a chat system prompt shared by every request): N requests, all arriving at once, each a
common prefix of random tokens followed by a short random suffix of its own, greedy, max_tokens fixed,
ignore_eos, seed 0, SmolLM2-135M in float32 by default. Two engines run in the same process (each with
its EngineCore child), measured in alternating order (on off, off on, ...) after a warm-up, and the
prefix cache is reset before every run, so each run computes the prefix once, cold. Time to first token
(TTFT) is measured per request from the moment all requests are submitted; throughput counts prompt +
output tokens (and output tokens alone) per second of wall time.

    python benchmarks/prefix_caching.py             # 32 requests, a 1,024-token prefix
    python benchmarks/prefix_caching.py --quick     # a few seconds: a smoke test
"""
from __future__ import annotations

import argparse
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
    p.add_argument("--prefix-len", type=int, default=1024, help="tokens of the shared prefix (default: 1024)")
    p.add_argument("--min-suffix", type=int, default=8, help="shortest suffix of its own, tokens (default: 8)")
    p.add_argument("--max-suffix", type=int, default=32, help="longest suffix of its own, tokens (default: 32)")
    p.add_argument("--output-len", type=int, default=16, help="max_tokens of every request (default: 16)")
    p.add_argument("--model", default=None, help="model folder / .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--rounds", type=int, default=2, help="measured runs per engine, after one warm-up (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    p.add_argument("--quick", action="store_true",
                   help="a tiny workload (4 requests, a 64-token prefix, 1 round): a smoke test, not a measurement")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if args.quick:
        args.num_requests, args.prefix_len, args.min_suffix, args.max_suffix = 4, 64, 4, 8
        args.output_len, args.rounds = 4, 1
    return args


def make_workload(args, vocab_size: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, vocab_size - 100) for _ in range(n)]

    prefix = tokens(args.prefix_len)
    return [prefix + tokens(rng.randint(args.min_suffix, args.max_suffix)) for _ in range(args.num_requests)]


def run_once(llm, prompts: list[list[int]], output_len: int) -> tuple[float, list[float], list[list[int]]]:
    """Submit every prompt at once, step until done: (wall s, TTFT s per request, output tokens per request)."""
    from minivllm import SamplingParams
    engine = llm.llm_engine
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    t0 = time.perf_counter()
    ids = [engine.add_request(None, p, params) for p in prompts]
    first: dict[str, float] = {}
    tokens: dict[str, list[int]] = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.outputs[0].token_ids and out.request_id not in first:
                first[out.request_id] = time.perf_counter() - t0
            if out.finished:
                tokens[out.request_id] = out.outputs[0].token_ids
    wall = time.perf_counter() - t0
    return wall, [first[i] for i in ids], [tokens[i] for i in ids]


def main(argv=None):
    args = parse_args(argv)
    from transformers import AutoConfig
    from minivllm import LLM
    from minivllm.models.loader import resolve_model
    folder = resolve_model(args.model)
    prompts = make_workload(args, AutoConfig.from_pretrained(folder).vocab_size)
    num_prompt = sum(map(len, prompts))
    num_output = args.num_requests * args.output_len
    max_model_len = args.prefix_len + args.max_suffix + args.output_len
    engines = {caching: LLM(str(folder), device=args.device, max_model_len=max_model_len,
                            enable_prefix_caching=caching) for caching in (True, False)}
    info = engines[True].llm_engine.info
    print(f"workload: {args.num_requests} requests, a {args.prefix_len}-token shared prefix + {args.min_suffix}-"
          f"{args.max_suffix} tokens each ({num_prompt} prompt tokens in all), {args.output_len} output tokens each; "
          f"{info['num_gpu_blocks']} KV blocks of {info['block_size']} tokens per engine")
    for llm in engines.values():  # warm-up
        run_once(llm, prompts[:2], 2)
    runs = {True: [], False: []}
    outputs = {}
    for r in range(args.rounds):
        for caching in ((True, False) if r % 2 == 0 else (False, True)):
            llm = engines[caching]
            assert llm.reset_prefix_cache(), "the engine is idle: the reset cannot be refused"
            wall, ttft, outputs[caching] = run_once(llm, prompts, args.output_len)
            runs[caching].append((wall, ttft, llm.llm_engine.get_stats()))
    print(f"{'prefix caching':<16}{'wall s':>8}{'TTFT mean s':>13}{'TTFT p50 s':>12}{'TTFT max s':>12}"
          f"{'total tok/s':>13}{'output tok/s':>14}{'cache hits':>12}")
    best = {}
    for caching, label in ((True, "on"), (False, "off")):
        wall, ttft, stats = min(runs[caching], key=lambda run: run[0])  # the fastest run of each
        best[caching] = (wall, statistics.mean(ttft))
        hits = stats["prefix_cache_hits"] / stats["prefix_cache_queries"] if stats["prefix_cache_queries"] else 0.0
        print(f"{label:<16}{wall:>8.2f}{statistics.mean(ttft):>13.3f}{statistics.median(ttft):>12.3f}"
              f"{max(ttft):>12.3f}{(num_prompt + num_output) / wall:>13.1f}{num_output / wall:>14.1f}{hits:>12.1%}")
    print(f"caching on vs off: TTFT {best[False][1] / best[True][1]:.2f}x lower, throughput "
          f"{best[False][0] / best[True][0]:.2f}x higher; greedy tokens identical: {outputs[True] == outputs[False]}")
    results.save(args, "prefix_caching", __file__, argv=argv, rounds=[
        {"round": r + 1, "prefix caching": "on" if caching else "off", "wall s": run[0],
         "TTFT mean s": statistics.mean(run[1]), "TTFT p50 s": statistics.median(run[1])}
        for caching in (True, False) for r, run in enumerate(runs[caching])], summary={
        "TTFT off / on (best runs)": best[False][1] / best[True][1],
        "throughput on / off (best runs)": best[False][0] / best[True][0],
        "greedy tokens identical": outputs[True] == outputs[False]})
    for llm in engines.values():
        llm.shutdown()


if __name__ == "__main__":
    main()
