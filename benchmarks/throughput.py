"""Throughput: minivllm vs HF transformers (static batched generate() and continuous batching), side by side.

Workload (nano-vllm's bench, scaled to a small CPU): N requests with random-token prompts of uniform length
[min_input, max_input] and max_tokens uniform in [min_output, max_output], ignore_eos, seed 0, SmolLM2-135M.
minivllm runs once per --dtype (float32 and bfloat16 by default), HF in float32. Each system runs once as
warm-up, then the systems are measured in alternating order (A B C, C B A, ...) in the same process so
machine noise hits all of them; every round is printed, then the best. Throughput counts the *requested*
output tokens per second of wall time. MFU = FLOPs the workload needs (weights + attention, prefill +
decode) / wall time / this machine's matmul rate in the system's dtype, measured in the same run.

The floor: every forward pass streams all weights once (the memory bandwidth, measured here as a torch
sum over a buffer of the weights' size) and the workload's FLOPs run at best at the measured GEMM rate;
the longest request needs max_tokens forward passes. The floor is the larger of the two; when neither
overlaps the other, the wall time would be their sum.

    python benchmarks/throughput.py                      # the default workload
    python benchmarks/throughput.py --dtype bfloat16     # one dtype only
    python benchmarks/throughput.py --profile            # also where a minivllm step's time goes
    python benchmarks/throughput.py --write-workload w.json --systems minivllm   # for benchmarks/vllm_cpu.py
"""
from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402

import results  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=32, help="requests in the workload (default: 32)")
    p.add_argument("--min-input", type=int, default=16, help="shortest random prompt, tokens (default: 16)")
    p.add_argument("--max-input", type=int, default=256, help="longest random prompt, tokens (default: 256)")
    p.add_argument("--min-output", type=int, default=16, help="smallest max_tokens (default: 16)")
    p.add_argument("--max-output", type=int, default=128, help="largest max_tokens (default: 128)")
    p.add_argument("--model", default=None, help="model folder / .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds per system (after one warm-up)")
    p.add_argument("--systems", default="minivllm,hf-static,hf-cb", help="comma-separated subset to run")
    p.add_argument("--profile", action="store_true", help="print where minivllm's step time goes")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default: 0)")
    p.add_argument("--dtype", default="float32,bfloat16",
                   help="comma-separated dtypes minivllm runs in (default: float32,bfloat16)")
    p.add_argument("--gemm-size", type=int, default=None, metavar="N",
                   help="the N x N multiply the peak GEMM rate (MFU's denominator) is measured with "
                        "(default: 2048 on the CPU, 8192 on a GPU; smaller is quicker and less exact)")
    p.add_argument("--write-workload", metavar="FILE", help="also write the workload's token ids as JSON")
    p.add_argument("--json", metavar="FILE", help="also write every round's times and the table as JSON")
    results.add_arguments(p)
    args = p.parse_args(argv)
    args.dtypes = args.dtype.split(",")
    if args.gemm_size is not None and args.gemm_size < 1:
        p.error(f"--gemm-size {args.gemm_size}: give a positive matrix size such as 2048")
    for dtype in args.dtypes:
        if dtype not in DTYPES:
            p.error(f"--dtype {dtype!r}: choose from {', '.join(DTYPES)}")
    return args


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SYSTEM_NAMES = {"float32": "minivllm", "bfloat16": "minivllm-bf16"}


def make_workload(args, vocab_size: int):
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, vocab_size - 100) for _ in range(rng.randint(args.min_input, args.max_input))]
               for _ in range(args.num_requests)]
    max_tokens = [rng.randint(args.min_output, args.max_output) for _ in range(args.num_requests)]
    return prompts, max_tokens


def layer_weights(config) -> int:
    """Matmul weights of one decoder layer (q, k, v, o and the gated MLP; norms are negligible)."""
    h, inter = config.hidden_size, config.intermediate_size
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    hd = getattr(config, "head_dim", None) or h // heads
    return h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter


def model_weights(config) -> int:
    """Matmul weights one forward pass reads: every layer's and lm_head's (the embedding only by row)."""
    return config.num_hidden_layers * layer_weights(config) + config.hidden_size * config.vocab_size


def workload_flops(config, prompts, max_tokens) -> float:
    """FLOPs the workload needs: 2 per weight per processed token, lm_head per generated token, attention."""
    h, layers, heads = config.hidden_size, config.num_hidden_layers, config.num_attention_heads
    hd = getattr(config, "head_dim", None) or h // heads
    total = 0.0
    for p, n in zip(prompts, max_tokens):
        processed = len(p) + n - 1  # the last sampled token is never fed back
        total += processed * layers * 2 * layer_weights(config)
        total += n * 2 * h * config.vocab_size  # lm_head, only where a token is sampled
        # attention: QK^T and PV, 2 * 2 * heads * hd per (query, visible key) pair, causal
        total += layers * 4 * heads * hd * processed * (processed + 1) / 2
    return total


def matmul_rate(device: str, dtype: torch.dtype = torch.float32, n: int | None = None) -> float:
    """This machine's GEMM rate in `dtype` (FLOP/s): the best of several n x n multiplies (n: 2048 on the CPU,
    8192 on a GPU, unless given), through every GEMM path the engine could use here (on the CPU: MKL's
    torch.mm, oneDNN with a packed weight and, in float32, minivllm's own compiled kernel), so that MFU is
    measured against the fastest of them."""
    n = n or (2048 if device == "cpu" else 8192)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    paths = [lambda: torch.mm(a, b)]
    if device == "cpu" and torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), n)
        paths.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    from minivllm import _C
    if device == "cpu" and _C.available() and dtype == torch.float32:
        panels = _C.pack_linear_weight(b.t())
        paths.append(lambda: _C.linear_small_batch(a, panels, None, n))
    best = float("inf")
    for path in paths:
        for _ in range(10):
            sync(device)
            t = time.perf_counter()
            path()
            sync(device)
            best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best


def memory_bandwidth(device: str, nbytes: int) -> float:
    """Bytes/s a torch sum streams over a buffer of `nbytes` (the weights' size): best of 5."""
    x = torch.ones(max(nbytes // 4, 1), device=device)
    best = float("inf")
    for _ in range(5):
        sync(device)
        t = time.perf_counter()
        x.sum()
        sync(device)
        best = min(best, time.perf_counter() - t)
    return x.numel() * 4 / best


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class MiniVLLM:
    def __init__(self, folder, device, max_model_len, dtype):
        from minivllm import LLM
        self.name, self.dtype = SYSTEM_NAMES[dtype], DTYPES[dtype]
        self.llm = LLM(str(folder), device=device, max_model_len=max_model_len, dtype=dtype)

    def run(self, prompts, max_tokens):
        from minivllm import SamplingParams
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)


class HFStatic:
    name, dtype = "hf-static", torch.float32

    def __init__(self, model, device):
        self.model, self.device = model, device

    def run(self, prompts, max_tokens):
        width = max(map(len, prompts))
        ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts], device=self.device)  # left padding
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=self.device)
        n = max(max_tokens)
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                                      do_sample=False, pad_token_id=0)
        return sum(min(m, out.shape[1] - width) for m in max_tokens)


class HFContinuous:
    name, dtype = "hf-cb", torch.float32

    def __init__(self, model, device):
        self.model = model

    def run(self, prompts, max_tokens):
        from transformers import GenerationConfig
        config = GenerationConfig(max_new_tokens=max(max_tokens), do_sample=False, eos_token_id=-1, pad_token_id=0)
        # generate_batch takes one max_new_tokens; per-request limits go through its manager, as it does itself.
        with torch.no_grad(), self.model.continuous_batching_context_manager(
                generation_config=config, block=True, timeout=5) as manager:
            ids = [manager.add_request(p, max_new_tokens=n) for p, n in zip(prompts, max_tokens)]
            done = {}
            while len(done) < len(ids):
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    done[result.request_id] = len(result.generated_tokens)
        return sum(done.values())


def main(argv=None):
    args = parse_args(argv)
    from transformers import AutoConfig, AutoModelForCausalLM
    from minivllm.models.loader import resolve_model
    torch.set_num_threads(os.cpu_count() if args.device == "cpu" else torch.get_num_threads())
    folder = resolve_model(args.model)
    config = AutoConfig.from_pretrained(folder)
    prompts, max_tokens = make_workload(args, config.vocab_size)
    if args.write_workload:
        Path(args.write_workload).write_text(json.dumps({"prompt_token_ids": prompts, "max_tokens": max_tokens}))
    requested = sum(max_tokens)
    systems = []
    for name in args.systems.split(","):
        if name == "minivllm":
            systems += [MiniVLLM(folder, args.device, args.max_input + args.max_output, d) for d in args.dtypes]
        else:
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(args.device).eval()
            systems.append((HFStatic if name == "hf-static" else HFContinuous)(hf, args.device))
    print(f"workload: {args.num_requests} requests, prompts {args.min_input}-{args.max_input} tokens "
          f"({sum(map(len, prompts))} in all), max_tokens {args.min_output}-{args.max_output} ({requested} in all)")
    dtypes = sorted({s.dtype for s in systems}, key=str)
    # measured before and after the runs; the best counts (noise only lowers it)
    peak = {d: matmul_rate(args.device, d, args.gemm_size) for d in dtypes}
    warm = min(4, len(prompts))
    for s in systems:  # warm-up
        s.run(prompts[:warm], [8] * warm)
    times = {s.name: [] for s in systems}
    for r in range(args.rounds):
        for s in (systems if r % 2 == 0 else systems[::-1]):
            sync(args.device)
            t = time.perf_counter()
            produced = s.run(prompts, max_tokens)
            sync(args.device)
            times[s.name].append(time.perf_counter() - t)
            assert produced >= requested, f"{s.name} produced {produced} of {requested} tokens"
        print(f"round {r + 1}: " + ", ".join(f"{n} {t[-1]:.2f} s" for n, t in times.items()))
    peak = {d: max(peak[d], matmul_rate(args.device, d, args.gemm_size)) for d in dtypes}
    flops = workload_flops(config, prompts, max_tokens)
    rates = ", ".join(f"{str(d).removeprefix('torch.')} {p / 1e9:.1f}" for d, p in peak.items())
    print(f"device: {args.device}, {torch.get_num_threads()} threads; measured matmul rate (GFLOP/s) {rates}; "
          f"workload needs {flops / 1e9:.1f} GFLOP")
    print(f"{'system':<15}{'best s':>9}{'tok/s':>10}{'MFU':>8}{'minivllm x':>12}")
    best = {n: min(t) for n, t in times.items()}
    dtype_of = {s.name: s.dtype for s in systems}
    base = next((n for n in best if n.startswith("minivllm")), None)  # the first minivllm row is 1.00x
    for name, t in best.items():
        ratio = best[name] / best[base] if base else float("nan")
        print(f"{name:<15}{t:>9.2f}{requested / t:>10.1f}{flops / t / peak[dtype_of[name]]:>8.1%}{ratio:>11.2f}x")
    for d in dtypes:
        print_floor(args, config, d, peak[d], flops, max(max_tokens), best)
    if args.json:
        device = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu"
        table = {n: dict(best_s=t, tok_per_s=requested / t, mfu=flops / t / peak[dtype_of[n]], rounds_s=times[n])
                 for n, t in best.items()}
        Path(args.json).write_text(json.dumps(dict(
            device=args.device, device_name=device, model=str(folder), num_requests=args.num_requests,
            prompt_tokens=sum(map(len, prompts)), output_tokens=requested, workload_gflop=flops / 1e9,
            matmul_gflop_per_s={str(d).removeprefix("torch."): p / 1e9 for d, p in peak.items()},
            systems=table), indent=1))
    results.save(args, "throughput", __file__, argv=argv, rounds=[
        {"round": r + 1, **{f"{n} s": t[r] for n, t in times.items()}} for r in range(args.rounds)], summary={
        "requests": args.num_requests, "prompt tokens": sum(map(len, prompts)), "output tokens": requested,
        **{f"{n} best tok/s": requested / t for n, t in best.items()},
        **{f"{n} median tok/s": requested / statistics.median(times[n]) for n in best},
        **{f"{n} MFU": flops / t / peak[dtype_of[n]] for n, t in best.items()}})
    if args.profile:
        for s in systems:
            if isinstance(s, MiniVLLM):
                s.llm.shutdown()
        print_profile(args, folder, prompts, max_tokens, best.get("minivllm"))


def print_floor(args, config, dtype, peak, flops, passes, best) -> None:
    """The physical floor in `dtype` and each minivllm run's distance to it (see the module docstring)."""
    params = model_weights(config)
    nbytes = params * torch.finfo(dtype).bits // 8
    stream = passes * nbytes / memory_bandwidth(args.device, nbytes)
    compute = flops / peak
    floor = max(stream, compute)
    name = SYSTEM_NAMES[str(dtype).removeprefix("torch.")]
    mine = f"; {name} is {best[name] / floor:.2f}x the floor" if name in best else ""
    print(f"floor {str(dtype).removeprefix('torch.')}: {passes} passes x {nbytes / 1e6:.0f} MB of weights = "
          f"{stream:.2f} s, {flops / 1e9:.0f} GFLOP at {peak / 1e9:.0f} GFLOP/s = {compute:.2f} s -> "
          f"{floor:.2f} s (both, unoverlapped: {stream + compute:.2f} s){mine}")


def print_profile(args, folder, prompts, max_tokens, mp_wall: float | None):
    """Wall time per phase of EngineCore.step(), from an in-process engine on the same workload."""
    from minivllm import LLM
    from minivllm.engine.profile import profile_engine
    llm = LLM(str(folder), device=args.device, max_model_len=args.max_input + args.max_output, multiprocess=False)
    profile_engine(llm, prompts[:4], [8] * len(prompts[:4]))  # warm-up
    phases = profile_engine(llm, prompts, max_tokens)
    llm.shutdown()
    total = sum(phases.values())
    if mp_wall is not None:  # the benchmark's multiprocess run minus this in-process one (noisy when small)
        phases["IPC (multiprocess - in-process)"] = max(mp_wall - total, 0.0)
    print(f"where the time goes (in-process profile, {total:.2f} s):")
    for name, t in phases.items():
        print(f"  {name:<34}{t:>8.2f} s {t / total:>7.1%}")


if __name__ == "__main__":
    main()
