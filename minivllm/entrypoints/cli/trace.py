"""`python -m minivllm trace`: one request's lifecycle, printed step by step from the real engine.

The focus request ("Once upon a time" by default) runs with a few neighbours
so continuous batching shows: they finish at different steps, their blocks go
back to the pool, and a request that waited for a slot is admitted mid-run.
All requests are submitted in one message, so every run prints the same trace.
The steps where something happens (an admission, a preemption, a resume, a
finish, a prefill chunk of the focus request) print in full, the others one
line each; the width follows the terminal unless --width fixes it. With
--shared-prefix every prompt starts with the same text, so the neighbours'
admissions show prefix-cache hits on the traced request's blocks.
"""
from __future__ import annotations

import argparse

from minivllm.engine.arg_utils import json_dict
from minivllm.tracing import run_traced
from minivllm.tracing.render import MIN_WIDTH, WIDTH

NEIGHBOURS = [
    ("The capital of France is", 6),
    ("Write a haiku about the sea.", 10),
    ("In a paged KV cache, every request owns a list of physical blocks.", 14),
    ("def fibonacci(n):", 8),
    ("The quick brown fox", 12),
    ("1, 2, 3, 4, 5,", 9),
]


def add_trace_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prompt", default="Once upon a time", help="the traced request's prompt (default: %(default)r)")
    p.add_argument("--shared-prefix", default="", metavar="TEXT",
                   help="put TEXT (e.g. a system prompt) before every prompt, the traced one's and each "
                        "neighbour's: once the traced request has cached its full blocks, a neighbour is admitted "
                        "past them (num_computed_tokens > 0) and shares those blocks (ref_cnt > 1)")
    p.add_argument("--max-tokens", type=int, default=24, help="tokens the traced request generates (greedy)")
    p.add_argument("--neighbours", type=int, default=3, choices=range(0, len(NEIGHBOURS) + 1), metavar="N",
                   help=f"neighbour requests sharing the engine, 0-{len(NEIGHBOURS)} (default: %(default)s)")
    p.add_argument("--max-num-seqs", type=int, default=3,
                   help="running-request cap; below 1 + neighbours some requests wait for a slot (default: 3)")
    p.add_argument("--max-num-batched-tokens", type=int, default=8192,
                   help="token budget per step; make it small (e.g. 4) to watch chunked prefill")
    p.add_argument("--num-blocks", type=int, default=None,
                   help="KV blocks in the pool, block 0 included; make it small (e.g. 6) to watch preemption")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    p.add_argument("--steps", type=int, default=0, metavar="N",
                   help="also print the first N steps in full (default: %(default)s); steps that admit, preempt, "
                        "resume or finish a request, or run a prefill chunk of the traced one, always print in "
                        "full, every other step prints one line")
    p.add_argument("--width", type=_width, default=None, metavar="N",
                   help=f"print N columns wide, for output that reads the same anywhere (default: $COLUMNS or the "
                        f"terminal's width, {WIDTH} when not printing to a terminal; at least {MIN_WIDTH})")
    p.add_argument("--json", metavar="FILE", help="also write the whole trace, machine-readable, to FILE")
    p.add_argument("--html", metavar="FILE", help="also write the trace as one self-contained viewer page to FILE")
    p.add_argument("--model", default=None, help="model folder, .gguf file or cached hub id (default: SmolLM2-135M)")
    p.add_argument("--in-process", action="store_true", help="run EngineCore in this process instead of a child")
    p.add_argument("--speculative-config", type=json_dict, default=None, metavar="JSON",
                   help='n-gram speculative decoding, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, '
                        '"prompt_lookup_max": 4}\': each step prints the drafts it verified, how many were accepted '
                        'and the rollback (default: off)')
    p.add_argument("--async-scheduling", action="store_true",
                   help="schedule step N+1 while step N runs (vLLM's async scheduling, off on the CPU by default): "
                        "each step prints when its schedule() began against the previous step's execute_model, "
                        "and the placeholder tokens scheduled before their values were known")
    p.add_argument("--tensor-parallel-size", type=int, default=1, metavar="N",
                   help="cut the model across N worker processes and show, for one step, what each rank held and "
                        "exchanged (SmolLM2-135M: 1 or 3) (default: %(default)s)")


def _width(value: str) -> int:
    if not value.isdigit():
        raise argparse.ArgumentTypeError(f"expected a number of columns, got {value!r}")
    width = int(value)
    if width < MIN_WIDTH:
        raise argparse.ArgumentTypeError(f"{width} columns is too narrow: give at least {MIN_WIDTH}")
    return width


def run_trace(args: argparse.Namespace, console=None):
    from minivllm import LLM, SamplingParams
    from minivllm.tracing.render import make_console, render_trace, terminal_width

    console = console or make_console(width=getattr(args, "width", None) or terminal_width())
    llm = LLM(args.model, block_size=args.block_size, max_num_batched_tokens=args.max_num_batched_tokens,
              max_num_seqs=args.max_num_seqs, num_gpu_blocks_override=args.num_blocks,
              max_model_len=2048, multiprocess=not args.in_process,
              tensor_parallel_size=getattr(args, "tensor_parallel_size", 1),
              speculative_config=getattr(args, "speculative_config", None),
              async_scheduling=getattr(args, "async_scheduling", False))
    try:
        prefix = getattr(args, "shared_prefix", "")
        prompts = [(prefix + args.prompt, SamplingParams(temperature=0, max_tokens=args.max_tokens))]
        prompts += [(prefix + p, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
                    for p, n in NEIGHBOURS[:args.neighbours]]
        trace = run_traced(llm, prompts)
        tokenizer = llm.llm_engine.tokenizer
        render_trace(trace, console, full_steps=args.steps, focus="0", decode=lambda t: tokenizer.decode([t]))
        if args.json:
            trace.to_json(args.json)
            console.print(f"trace written to {args.json}")
        if getattr(args, "html", None):
            from minivllm.tracing.html import write_html
            write_html(trace, args.html, llm.llm_engine.config)
            console.print(f"viewer written to {args.html}")
        return trace
    finally:
        llm.shutdown()
