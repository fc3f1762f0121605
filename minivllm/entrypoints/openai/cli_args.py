"""Mirror of vllm/entrypoints/openai/cli_args.py: the flags of `serve`, apart from the server itself.

Kept out of api_server.py so that `python -m minivllm --help` and `trace` do not import FastAPI.
"""
from __future__ import annotations

import argparse

from minivllm.engine.arg_utils import EngineArgs

DEFAULT_TRACE_MAX_STEPS = 200  # the live /trace page's window (minivllm.tracing.live keeps the same default)
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20  # 16 MiB: any prompt max_model_len can hold, many times over
# vLLM's defaults for its OpenAI server on a CPU (EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER):
# a smaller step than the offline LLM's, so a burst of prompts is prefilled in chunks and the first of them
# stream sooner. `LLM` takes vLLM's LLM-class defaults instead (config.batch_default: 4096 per rank on a CPU; 256).
SERVER_MAX_NUM_BATCHED_TOKENS, SERVER_MAX_NUM_SEQS = 2048, 128


def make_arg_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """`serve [MODEL]`, the server's flags, then every engine argument (EngineArgs.add_cli_args)."""
    parser.add_argument("model_tag", nargs="?", default=None, help="the model to serve (same as --model)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: %(default)s)")
    parser.add_argument("--served-model-name", default=None,
                        help="the model's name in the API (default: the model argument, or SmolLM2-135M-Instruct)")
    parser.add_argument("--trust-request-chat-template", action="store_true",
                        help="accept a chat_template sent with a request (vLLM's flag; off: such a request is a 400)")
    parser.add_argument("--max-request-body-bytes", type=int, default=DEFAULT_MAX_REQUEST_BODY_BYTES,
                        help="a larger HTTP body is refused with a 413 before it is read whole (minivllm's; vLLM "
                             "leaves this to a proxy) (default: %(default)s)")
    parser.add_argument("--trace-max-steps", type=int, default=DEFAULT_TRACE_MAX_STEPS,
                        help="the live viewer at /trace keeps the last this many engine steps (minivllm's; tracing "
                             "runs only while a /trace page is open) (default: %(default)s)")
    parser.add_argument("--headless", action="store_true",
                        help="run this machine's tensor-parallel workers only, no server and no EngineCore: the "
                             "launch on every node but node 0 (with --nnodes, --node-rank >= 1, --master-addr, "
                             "--master-port); it ends when node 0's engine shuts down")
    parser.add_argument("--uvicorn-log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug", "trace"],
                        help="uvicorn's log level (default: %(default)s)")
    EngineArgs.add_cli_args(parser)
    parser.set_defaults(max_num_batched_tokens=SERVER_MAX_NUM_BATCHED_TOKENS, max_num_seqs=SERVER_MAX_NUM_SEQS)
    return parser
