"""Throughput: minivllm vs HF transformers (static batched generate() and continuous batching), side by side.

Workload (nano-vllm's bench, scaled to a small CPU): N requests with random-token prompts of uniform length
[min_input, max_input] and max_tokens uniform in [min_output, max_output], ignore_eos, seed 0, SmolLM2-135M in
float32. Each system runs once as warm-up, then the systems are measured in alternating order (A B C, C B A, ...)
in the same process so machine noise hits all of them. Throughput counts the *requested* output tokens per
second of wall time. MFU = FLOPs the workload needs (weights + attention, prefill + decode) / wall time /
this machine's fp32 matmul rate, measured in the same run.

    python benchmarks/throughput.py                # the default workload
    python benchmarks/throughput.py --profile      # also where a minivllm step's time goes
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import torch  # noqa: E402


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
    return p.parse_args(argv)


def make_workload(args, vocab_size: int):
    rng = random.Random(args.seed)
    prompts = [[rng.randrange(100, vocab_size - 100) for _ in range(rng.randint(args.min_input, args.max_input))]
               for _ in range(args.num_requests)]
    max_tokens = [rng.randint(args.min_output, args.max_output) for _ in range(args.num_requests)]
    return prompts, max_tokens


def workload_flops(config, prompts, max_tokens) -> float:
    """FLOPs the workload needs: 2 per weight per processed token, lm_head per generated token, attention."""
    h, layers, inter = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    heads, kv = config.num_attention_heads, getattr(config, "num_key_value_heads", config.num_attention_heads)
    hd = getattr(config, "head_dim", None) or h // heads
    per_token_layer = 2 * (h * heads * hd + 2 * h * kv * hd + heads * hd * h + 3 * h * inter)
    total = 0.0
    for p, n in zip(prompts, max_tokens):
        processed = len(p) + n - 1  # the last sampled token is never fed back
        total += processed * layers * per_token_layer
        total += n * 2 * h * config.vocab_size  # lm_head, only where a token is sampled
        # attention: QK^T and PV, 2 * 2 * heads * hd per (query, visible key) pair, causal
        total += layers * 4 * heads * hd * processed * (processed + 1) / 2
    return total


def matmul_rate(device: str) -> float:
    """This machine's fp32 GEMM rate (FLOP/s): the best of several square multiplies, through every
    GEMM path the engine could use here (on the CPU: MKL's torch.mm, oneDNN with a packed weight and
    minivllm's own compiled kernel), so that MFU is measured against the fastest of them."""
    n = 2048 if device == "cpu" else 8192
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    paths = [lambda: torch.mm(a, b)]
    if device == "cpu" and torch.backends.mkldnn.is_available():
        packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), n)
        paths.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
    from minivllm import _C
    if device == "cpu" and _C.available():
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


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


class MiniVLLM:
    name = "minivllm"

    def __init__(self, folder, device, max_model_len):
        from minivllm import LLM
        self.llm = LLM(str(folder), device=device, max_model_len=max_model_len)

    def run(self, prompts, max_tokens):
        from minivllm import SamplingParams
        params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in max_tokens]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs)


class HFStatic:
    name = "hf-static"

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
    name = "hf-cb"

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
    requested = sum(max_tokens)
    names = args.systems.split(",")
    systems = []
    for name in names:
        if name == "minivllm":
            systems.append(MiniVLLM(folder, args.device, args.max_input + args.max_output))
        else:
            hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(args.device).eval()
            systems.append((HFStatic if name == "hf-static" else HFContinuous)(hf, args.device))
    print(f"workload: {args.num_requests} requests, prompts {args.min_input}-{args.max_input} tokens "
          f"({sum(map(len, prompts))} in all), max_tokens {args.min_output}-{args.max_output} ({requested} in all)")
    peak = matmul_rate(args.device)  # measured before and after the runs; the best counts (noise only lowers it)
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
    peak = max(peak, matmul_rate(args.device))
    flops = workload_flops(config, prompts, max_tokens)
    print(f"device: {args.device}, {torch.get_num_threads()} threads; measured fp32 matmul rate "
          f"{peak / 1e9:.1f} GFLOP/s; workload needs {flops / 1e9:.1f} GFLOP")
    print(f"{'system':<12}{'best s':>9}{'tok/s':>10}{'MFU':>8}{'minivllm x':>12}")
    best = {n: min(t) for n, t in times.items()}
    for name, t in best.items():
        ratio = best[name] / best["minivllm"] if "minivllm" in best else float("nan")
        print(f"{name:<12}{t:>9.2f}{requested / t:>10.1f}{flops / t / peak:>8.1%}{ratio:>11.2f}x")
    if args.profile:
        for s in systems:
            if s.name == "minivllm":
                s.llm.shutdown()
        print_profile(args, folder, prompts, max_tokens, best.get("minivllm"))


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
