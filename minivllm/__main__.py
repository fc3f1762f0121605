"""Command line: `python -m minivllm trace` (the main job), `generate`, `serve` (`vllm serve`), `trace-serve`."""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    from minivllm.entrypoints.cli.trace import add_trace_arguments, run_trace

    parser = argparse.ArgumentParser(
        prog="python -m minivllm", description="minivllm: vLLM's V1 engine, small.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n"
               "  python -m minivllm trace                      # one request, step by step (make trace)\n"
               "  python -m minivllm trace --html trace.html    # the same trace in the browser viewer\n"
               "  python -m minivllm generate 'Once upon a time' --max-tokens 20\n"
               "  python -m minivllm serve --port 8000          # OpenAI-compatible server (make serve)\n"
               "  python -m minivllm trace-serve                # the server admitting requests (make trace-serve)\n"
               "each subcommand takes --help.")
    sub = parser.add_subparsers(dest="command", required=True)
    trace = sub.add_parser("trace", help="print one request's lifecycle through the engine, step by step",
                           description="Follow one request from LLM.generate() to text: SchedulerOutput, the "
                                       "packed batch, slot_mapping and block_table at every step.")
    add_trace_arguments(trace)
    gen = sub.add_parser("generate", help="generate text for one prompt with LLM.generate() and print it",
                         description="Generate text for one prompt with LLM.generate() (greedy by default) and "
                                     "print the prompt followed by the completion.")
    gen.add_argument("prompt", help="the prompt text")
    gen.add_argument("--max-tokens", type=int, default=50, help="tokens to generate (default: %(default)s)")
    gen.add_argument("--temperature", type=float, default=0.0, help="0 is greedy (default: %(default)s)")
    gen.add_argument("--model", default=None, help="model folder, .gguf file or cached hub id")
    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server over the same EngineCore",
                           description="Serve /v1/completions, /v1/chat/completions (streamed or not), /v1/models, "
                                       "/health and /metrics, as `vllm serve`. Every engine argument is a flag.")
    from minivllm.entrypoints.openai.cli_args import make_arg_parser
    make_arg_parser(serve)
    from minivllm.entrypoints.cli.serve_trace import add_arguments, run_serve_trace
    serve_trace = sub.add_parser("trace-serve", help="watch the server admit requests while others decode",
                                 description="Start the server with tracing, stream from three clients at "
                                             "different moments, print every engine step.")
    add_arguments(serve_trace)
    args = parser.parse_args(argv)
    try:
        if args.command == "trace":
            run_trace(args)
        elif args.command == "trace-serve":
            run_serve_trace(args)
        elif args.command == "serve":
            from minivllm.entrypoints.openai.api_server import run_server
            return run_server(args) or 0  # non-zero: a --headless node's workers failed
        else:
            from minivllm import LLM, SamplingParams
            llm = LLM(args.model)
            out = llm.generate([args.prompt], SamplingParams(max_tokens=args.max_tokens,
                                                             temperature=args.temperature), use_tqdm=False)
            print(args.prompt + out[0].outputs[0].text)
            llm.shutdown()
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
