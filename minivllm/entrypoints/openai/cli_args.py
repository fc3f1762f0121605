"""Mirror of vllm/entrypoints/openai/cli_args.py: the flags of `serve`, apart from the server itself.

Kept out of api_server.py so that `python -m minivllm --help` and `trace` do not import FastAPI.
"""
from __future__ import annotations

import argparse

from minivllm.engine.arg_utils import EngineArgs

DEFAULT_TRACE_MAX_STEPS = 200  # the live /trace page's window (minivllm.entrypoints.openai.trace_page keeps the same default)
DEFAULT_MAX_REQUEST_BODY_BYTES = 16 << 20  # 16 MiB: any prompt max_model_len can hold, many times over
# vLLM's defaults for its OpenAI server on a CPU (EngineArgs.get_batch_defaults, UsageContext.OPENAI_API_SERVER):
# a smaller step than the offline LLM's, so a burst of prompts is prefilled in chunks and the first of them
# stream sooner. `LLM` takes vLLM's LLM-class defaults instead (config.batch_default: 4096 per rank on a CPU; 256).
SERVER_MAX_NUM_BATCHED_TOKENS, SERVER_MAX_NUM_SEQS = 2048, 128


TRACE_PAGE_HELP = (
    "serve minivllm's live trace viewer at GET /trace and /trace/events (vLLM has none; off: both are 404). "
    "Anyone who can reach the server can open it, with no login, and watch every client's requests step by step: "
    "batch sizes, token counts, block ids and queues, with request ids shown as aliases (req-1, req-2, ...). "
    "Request text and token ids are left out unless --trace-page-show-requests is given too. EngineCore traces "
    "only while a page is open.")
SHOW_REQUESTS_HELP = (
    "with --enable-trace-page: the page also shows every request's text and token ids (prompts as rendered by "
    "the chat template, generated text, stop strings) and its real request id, to anyone who opens it. For a "
    "demo server whose clients agreed to it; never on a shared or public server.")


def check_trace_page_args(enable_trace_page: bool, trace_page_show_requests: bool) -> None:
    """The second flag alone would be a no-op that looks like a choice: refuse it, naming the fix."""
    if trace_page_show_requests and not enable_trace_page:
        raise ValueError("--trace-page-show-requests only changes what the trace page shows, and the page is off: "
                         "add --enable-trace-page too, or drop --trace-page-show-requests.")


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
    parser.add_argument("--enable-trace-page", action="store_true", help=TRACE_PAGE_HELP)
    parser.add_argument("--trace-page-show-requests", action="store_true", help=SHOW_REQUESTS_HELP)
    parser.add_argument("--trace-max-steps", type=int, default=DEFAULT_TRACE_MAX_STEPS,
                        help="with --enable-trace-page: the live viewer at /trace keeps the last this many engine "
                             "steps (minivllm's) (default: %(default)s)")
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
