"""A shared CPU: minivllm alone and beside a busy neighbour, with OpenMP threads that spin or sleep.

The workload of benchmarks/throughput.py (fewer requests by default) runs in EngineCore's child with
libgomp's threads spinning 2,000 iterations between parallel regions before they sleep (GOMP_SPINCOUNT,
minivllm's default for the child), 20,000, sleeping at once (OMP_WAIT_POLICY=PASSIVE) and spinning
without end (ACTIVE), each alone and while a neighbour process keeps one core busy with its own
single-threaded matmuls. Configurations alternate round by round; every round is printed. What to
expect of an engine that shares fairly: beside a neighbour on one of two cores, about 1.5-2x its
time alone, not a collapse.

    python benchmarks/shared_cpu.py                 # 8 requests, 3 rounds
    python benchmarks/shared_cpu.py --num-requests 32 --rounds 2 --dtype float32
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import results  # noqa: E402
import throughput  # noqa: E402


def neighbour(stop) -> None:
    """A busy single-threaded job: the kind of load another user or a test run puts on the machine."""
    import torch
    torch.set_num_threads(1)
    a = torch.randn(256, 256)
    while not stop.is_set():
        a = torch.tanh(a @ a)


CONFIGS = {  # name -> the child's OpenMP environment (read by its libgomp as it loads)
    "spin-2000": {"GOMP_SPINCOUNT": "2000"},  # minivllm's default for the child: spin briefly, then sleep
    "spin-20000": {"GOMP_SPINCOUNT": "20000"},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},  # sleep at once
    "active": {"OMP_WAIT_POLICY": "ACTIVE"},  # spin without end
}


def run_once(args, prompts, max_tokens, config: str) -> float:
    from minivllm import LLM, SamplingParams
    os.environ.update(CONFIGS[config])
    try:
        llm = LLM(args.model, dtype=args.dtype, max_model_len=args.max_input + args.max_output)
    finally:
        for name in CONFIGS[config]:
            del os.environ[name]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    llm.generate(prompts[:2], [SamplingParams(max_tokens=4, ignore_eos=True)] * 2, use_tqdm=False)  # warm-up
    t = time.perf_counter()
    llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t
    llm.shutdown()
    return wall


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=8, help="requests in the workload (default: 8)")
    p.add_argument("--rounds", type=int, default=3, help="rounds per configuration (default: 3)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"], help="(default: bfloat16)")
    p.add_argument("--model", default=None, help="model folder / .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}")
    results.add_arguments(p)
    args = p.parse_args(argv)
    names = args.configs.split(",")
    for name in names:
        if name not in CONFIGS:
            p.error(f"--configs: {name!r} is not one of {', '.join(CONFIGS)}")
    w = throughput.parse_args(["--num-requests", str(args.num_requests)])
    args.max_input, args.max_output = w.max_input, w.max_output
    prompts, max_tokens = throughput.make_workload(w, 49152)
    configs = [(policy, busy) for busy in (False, True) for policy in names]
    times = {c: [] for c in configs}
    ctx = multiprocessing.get_context("spawn")
    for r in range(args.rounds):
        for policy, busy in (configs if r % 2 == 0 else configs[::-1]):
            stop = ctx.Event()
            job = ctx.Process(target=neighbour, args=(stop,), daemon=True) if busy else None
            if job:
                job.start()
            try:
                times[(policy, busy)].append(run_once(args, prompts, max_tokens, policy))
            finally:
                if job:
                    stop.set()
                    job.join(timeout=5)
        print(f"round {r + 1}: " + ", ".join(f"{pol}{' + neighbour' if b else ''} {t[-1]:.2f} s"
                                              for (pol, b), t in times.items()), flush=True)
    print(f"{'child OpenMP':<16}{'alone s':>9}{'beside a neighbour s':>22}{'ratio':>8}   (medians)")
    summary = {}
    for policy in names:
        alone, busy = (sorted(times[(policy, b)])[len(times[(policy, b)]) // 2] for b in (False, True))
        print(f"{policy:<16}{alone:>9.2f}{busy:>22.2f}{busy / alone:>7.2f}x")
        summary[f"{policy}: beside a neighbour / alone, median"] = busy / alone
    results.save(args, "shared_cpu", __file__, argv=argv, summary=summary, rounds=[
        {"round": r + 1, "child OpenMP": pol, "neighbour": b, "wall s": t[r]}
        for (pol, b), t in times.items() for r in range(args.rounds)])


if __name__ == "__main__":
    main()
