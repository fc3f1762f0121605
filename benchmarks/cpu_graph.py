"""minivllm with CPU graphs (the default) against the same engine with enforce_eager=True, alternating in one process.

Two workloads, each round both engines in turn (the order flips every round): benchmarks/throughput.py's
32 requests (ignore_eos, greedy; prefix caching off, so every round prefills cold), and one request decoding
alone (time per output token, where the Python between the ops weighs most). Prints every round with its
ratio, then the best and the median, each engine's start-up time (the graphed one includes its capture) and
whether the two gave the same tokens (they must: a replay runs the same kernels on the same data).

    python benchmarks/cpu_graph.py --rounds 4
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
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per engine and workload (default: 3)")
    p.add_argument("--single-tokens", type=int, default=128, help="tokens the lone request decodes (default: 128)")
    p.add_argument("--quick", action="store_true", help="a few tiny requests (the test suite's smoke run)")
    results.add_arguments(p)
    args = p.parse_args(argv)
    from minivllm import LLM, SamplingParams
    from minivllm.models.loader import resolve_model
    from transformers import AutoConfig

    folder = str(resolve_model(args.model))
    quick = ["--num-requests", "3", "--min-input", "4", "--max-input", "12", "--min-output", "2", "--max-output", "6"]
    w = throughput.parse_args(quick if args.quick else [])
    prompts, max_tokens = throughput.make_workload(w, AutoConfig.from_pretrained(folder).vocab_size)
    single = prompts[0][:16], (4 if args.quick else args.single_tokens)
    engines, startup = {}, {}
    for name, eager in (("graphs", False), ("eager", True)):
        t = time.perf_counter()
        engines[name] = LLM(folder, dtype=args.dtype, max_model_len=w.max_input + max(w.max_output, single[1]),
                            multiprocess=False, enable_prefix_caching=False, enforce_eager=eager)
        startup[name] = time.perf_counter() - t

    def run(name: str, ps, mt) -> tuple[float, list]:
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in mt]
        t = time.perf_counter()
        outs = engines[name].generate(ps, params, use_tqdm=False)
        return time.perf_counter() - t, [o.outputs[0].token_ids for o in outs]

    for name in engines:  # warm-up, as a user's first call
        run(name, prompts[:4], [8] * min(4, len(prompts)))
    workloads = {"32 requests (s)": (prompts, max_tokens), "one request (ms/token)": ([single[0]], [single[1]])}
    times = {(wl, n): [] for wl in workloads for n in engines}
    same = True
    for r in range(args.rounds):
        for wl, (ps, mt) in workloads.items():
            order = list(engines) if r % 2 == 0 else list(engines)[::-1]
            tokens = {}
            for name in order:
                t, tokens[name] = run(name, ps, mt)
                times[wl, name].append(t if len(ps) > 1 else 1e3 * t / mt[0])
            same &= tokens["graphs"] == tokens["eager"]
            g, e = times[wl, "graphs"][-1], times[wl, "eager"][-1]
            print(f"round {r + 1}: {wl:<24} graphs {g:8.2f}  eager {e:8.2f}  eager / graphs {e / g:.2f}x", flush=True)
    print(f"\n{'workload':<24} {'graphs best':>12} {'eager best':>11} {'ratio':>7} {'graphs med':>11} "
          f"{'eager med':>10} {'ratio':>7}")
    for wl in workloads:
        g, e = times[wl, "graphs"], times[wl, "eager"]
        print(f"{wl:<24} {min(g):12.2f} {min(e):11.2f} {min(e) / min(g):6.2f}x {statistics.median(g):11.2f} "
              f"{statistics.median(e):10.2f} {statistics.median(e) / statistics.median(g):6.2f}x")
    graph = engines["graphs"].llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner.model
    served = "none (refused: see the log)" if getattr(graph, "template", None) is None else \
        f"1-{graph.template.sizes[-1]} requests, {len(graph.template.calls)} C calls, {graph.num_replays} replays"
    print(f"start-up: graphs {startup['graphs']:.2f} s (with the capture), eager {startup['eager']:.2f} s; "
          f"decode batches replayed: {served}; same tokens: {same}")
    results.save(args, "cpu_graph", __file__, argv=argv, rounds=[
        {"round": r + 1, "workload": wl, "graphs": times[wl, "graphs"][r], "eager": times[wl, "eager"][r],
         "eager / graphs": times[wl, "eager"][r] / times[wl, "graphs"][r]}
        for r in range(args.rounds) for wl in workloads], summary={
        **{f"{wl}: eager / graphs, median": statistics.median(times[wl, "eager"]) / statistics.median(
            times[wl, "graphs"]) for wl in workloads},
        "start-up graphs s": startup["graphs"], "start-up eager s": startup["eager"], "same tokens": same})


if __name__ == "__main__":
    main()
