"""Mirror of vllm/v1/engine/llm_engine.py: the caller-side engine between LLM and EngineCore.

`add_request` tokenizes and validates in the caller's process, then hands an
EngineCoreRequest to the client. `step()` submits nothing and runs nothing
itself: it takes outputs EngineCore already produced, detokenizes them, checks
stop strings and aborts the requests those stopped. Left out: input
preprocessing for multimodal prompts, stats loggers, LoRA.
"""
from __future__ import annotations

import dataclasses
import itertools
import logging
import time

import torch

from minivllm.config import EngineConfig, default_sampling_overrides
from minivllm.core.kv_cache_utils import resolve_sizes
from minivllm.core.sched.utils import check_request_fits
from minivllm.engine import EngineCoreRequest
from minivllm.engine.core_client import make_client
from minivllm.engine.output_processor import OutputProcessor
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.models.loader import load_config, resolve_model
from minivllm.outputs import RequestOutput
from minivllm.platforms import resolve_dtype
from minivllm.sampling_params import SEED_RANGE, SamplingParams, is_int

logger = logging.getLogger("minivllm")


class LLMEngine:
    def __init__(self, config: EngineConfig, multiprocess: bool | None = None) -> None:
        from transformers import AutoTokenizer
        self.model_folder = resolve_model(config.model)
        self.hf_config = load_config(self.model_folder)  # an unsupported architecture fails here, in the caller
        dtype = resolve_dtype(config.dtype, getattr(self.hf_config, "dtype", None), config.device)
        self.config = config = dataclasses.replace(config, dtype=dtype)  # "auto" resolved once, for every process
        resolve_sizes(config, self.hf_config)  # so does a size this machine cannot hold
        if config.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device: use device='cpu'.")
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_folder)
        self.sampling_overrides = default_sampling_overrides(self.model_folder, config.generation_config)
        if self.sampling_overrides:
            logger.info("Default sampling parameters from the model's generation_config.json: %s (pass "
                        "generation_config='vllm' to ignore them)", self.sampling_overrides)
        self.engine_core = make_client(config, self.model_folder, multiprocess)
        self.info = self.engine_core.info
        self.output_processor = OutputProcessor(self.tokenizer)
        self._request_counter = itertools.count()
        self.tracer = None

    @classmethod
    def from_engine_args(cls, engine_args: EngineConfig, multiprocess: bool | None = None) -> "LLMEngine":
        """As vLLM: build the engine from an EngineArgs (any EngineConfig will do)."""
        if not isinstance(engine_args, EngineConfig):
            raise ValueError(f"from_engine_args takes an EngineArgs, got {type(engine_args).__name__}: "
                             f"EngineArgs(model=..., ...) or EngineArgs.from_cli_args(args).")
        return cls(engine_args, multiprocess)

    def get_default_sampling_params(self) -> SamplingParams:
        """SamplingParams with the model's generation_config.json defaults (none with generation_config="vllm")."""
        return SamplingParams(**self.sampling_overrides)

    def start_profile(self) -> None:
        self._check_profiler()
        self.engine_core.call_utility("profile", True)

    def stop_profile(self) -> None:
        self._check_profiler()
        self.engine_core.call_utility("profile", False)

    def _check_profiler(self) -> None:
        if not self.config.profiler_config or not self.config.profiler_config.get("profiler"):
            raise ValueError("The profiler is off: create the engine with profiler_config={'profiler': 'torch', "
                             "'torch_profiler_dir': './profile'} to use start_profile()/stop_profile().")

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def next_request_id(self) -> str:
        return str(next(self._request_counter))

    def process_inputs(self, request_id: str, prompt, params: SamplingParams,
                       priority: int = 0) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate; raise ValueError naming what to change. Nothing is sent yet.

        `prompt` is a string, a list of token ids, or vLLM's dict forms {"prompt": text} and
        {"prompt_token_ids": ids}. The engine works on its own copy of `params` (EOS joins the ids
        that min_tokens holds back, bad words are tokenized), so one SamplingParams can serve many
        prompts and engines. A request with n > 1 stays one request here; add_processed_requests
        fans it out into n children.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        if not is_int(priority):
            raise ValueError(f"priority must be an int (lower runs first), got {priority!r}")
        text, token_ids = self._tokenize(prompt)
        vocab = self.hf_config.vocab_size
        if not all(is_int(t) and 0 <= t < vocab for t in token_ids):
            raise ValueError(f"Prompt token ids must be ints in [0, {vocab}).")
        self._check_logprobs(params.logprobs, vocab)
        self._check_logprobs(params.prompt_logprobs, vocab, "prompt_logprobs")
        self._check_token_ids_in_vocab(params, vocab)
        check_request_fits(len(token_ids), params.max_tokens, self.info["max_model_len"],
                           self.info["block_size"], self.info["num_gpu_blocks"])
        params = params.clone()
        params.update_from_generation_config(self.eos_token_id)
        params.update_from_tokenizer(self.tokenizer, vocab)
        return text, EngineCoreRequest(request_id, token_ids, params, self.eos_token_id, time.time(), priority)

    def _tokenize(self, prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), self._token_list(prompt["prompt_token_ids"])
            if "prompt" not in prompt:
                raise ValueError(f"A dict prompt needs 'prompt' (text) or 'prompt_token_ids', got keys "
                                 f"{sorted(prompt)}.")
            prompt = prompt["prompt"]
            if not isinstance(prompt, str):
                raise ValueError(f"A dict prompt's 'prompt' must be a string, got {type(prompt).__name__}.")
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("The prompt is an empty string: pass some text or token ids.")
            return prompt, self.tokenizer.encode(prompt)
        return None, self._token_list(prompt)

    @staticmethod
    def _token_list(ids) -> list[int]:
        if not isinstance(ids, (list, tuple)):
            raise ValueError(f"Prompt token ids must be a list of ints, got {type(ids).__name__}.")
        return list(ids)

    @staticmethod
    def _check_token_ids_in_vocab(params: SamplingParams, vocab: int) -> None:
        """As vLLM's _validate_logit_bias / _validate_allowed_token_ids, and a seed per child that fits."""
        for name in ("logit_bias", "allowed_token_ids"):
            ids = getattr(params, name)
            outside = sorted({t for t in ids if t >= vocab}) if ids else []
            if outside:
                raise ValueError(f"SamplingParams.{name} has token ids {outside} outside the vocabulary [0, {vocab}).")
        k = params.num_samples
        if k > 1 and params.seed is not None and params.seed + k - 1 > SEED_RANGE[1]:
            raise ValueError(f"SamplingParams.seed={params.seed}: with {k} samples the children's seeds (seed + "
                             f"index) pass {SEED_RANGE[1]}; pick a smaller seed.")

    def _check_logprobs(self, logprobs: int | None, vocab: int, name: str = "logprobs") -> None:
        """As vLLM: at most max_logprobs alternatives (-1 lifts the cap); logprobs=-1 means the whole vocabulary."""
        if logprobs is None:
            return
        limit = vocab if self.config.max_logprobs == -1 else self.config.max_logprobs
        wanted = vocab if logprobs == -1 else logprobs
        if wanted > min(limit, vocab):
            raise ValueError(f"SamplingParams.{name}={logprobs} asks for {wanted} alternatives, more than allowed "
                             f"({min(limit, vocab)}: max_logprobs={self.config.max_logprobs}, vocabulary {vocab}). "
                             f"Lower {name}, or raise the engine argument max_logprobs (-1: no limit).")

    def add_request(self, request_id: str | None, prompt: str | list[int], params: SamplingParams | None = None,
                    priority: int = 0) -> str:
        request_id = request_id if request_id is not None else self.next_request_id()
        text, request = self.process_inputs(request_id, prompt, params or SamplingParams(), priority)
        self.add_processed_request(text, request)
        return request_id

    def add_processed_request(self, text: str | None, request: EngineCoreRequest) -> None:
        self.add_processed_requests([(text, request)])

    def add_processed_requests(self, processed: list[tuple[str | None, EngineCoreRequest]]) -> None:
        """Register and send; a request with n > 1 goes as n children "{index}_{id}" (vLLM's ParentRequest)."""
        to_send = []
        for text, request in processed:
            params = request.sampling_params
            if params.num_samples == 1:
                children = [(request, None, 0)]
            else:
                parent = ParentRequest(request.request_id, params)
                children = []
                for index in range(params.num_samples):
                    child_id, child_params = parent.get_child_info(index)
                    children.append((dataclasses.replace(request, request_id=child_id, sampling_params=child_params),
                                     parent, index))
            for child, parent, index in children:
                self.output_processor.add_request(child.request_id, text, child.prompt_token_ids,
                                                  child.sampling_params, parent, index)
                if self.tracer is not None:
                    self.tracer.on_submit(child, text)
                to_send.append(child)
        self.engine_core.add_requests(to_send)

    def step(self) -> list[RequestOutput]:
        outputs = self.engine_core.get_output()  # 1. outputs EngineCore already produced
        processed = self.output_processor.process_outputs(outputs.outputs)  # 2. detokenize, stop strings
        self.engine_core.abort_requests(processed.reqs_to_abort)  # 3. free what a stop string ended
        if self.tracer is not None:
            self.tracer.on_outputs(outputs, processed)
        return processed.request_outputs

    def enable_tracing(self):
        """Record every step from here on (see minivllm.tracing); returns the Trace being filled."""
        from minivllm.tracing.tracer import Trace
        self.engine_core.call_utility("enable_tracing")
        self.engine_core.take_trace_events()  # nothing from an earlier trace leaks into this one
        self.tracer = Trace(self.info, source=self.engine_core.take_trace_events)
        return self.tracer

    def collect_trace(self):
        """Pull events EngineCore recorded after its last output (late aborts) into the trace."""
        if self.tracer is not None:
            self.tracer.extend(self.engine_core.take_trace_events())
            self.tracer.extend(self.engine_core.call_utility("drain_trace"))
        return self.tracer

    def abort_request(self, request_ids: list[str]) -> None:
        """Abort requests; the id of an n > 1 request aborts its children still running."""
        children = self.output_processor.abort_requests(request_ids)
        self.engine_core.abort_requests(list(dict.fromkeys([*request_ids, *children])))

    def has_unfinished_requests(self) -> bool:
        return self.output_processor.has_unfinished_requests()

    def get_num_free_blocks(self) -> int:
        return self.engine_core.call_utility("get_num_free_blocks")

    def get_stats(self) -> dict:
        return self.engine_core.call_utility("get_stats")

    def reset_prefix_cache(self) -> bool:
        """Forget every cached prefix in EngineCore; False while requests are running (as vLLM)."""
        return self.engine_core.call_utility("reset_prefix_cache")

    def shutdown(self) -> None:
        self.engine_core.shutdown()
