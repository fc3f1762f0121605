"""Mirror of vllm/v1/engine/processor.py (`Processor`; newer vLLM: input_processor.py, `InputProcessor`).

The one front end. Both caller-side engines, LLMEngine (offline, LLM) and AsyncLLM (the server), turn a prompt into
EngineCoreRequests here and nowhere else: normalise the prompt (`parse_prompt`: a string, token
ids, {"prompt": text} or {"prompt_token_ids": ids}), tokenize, validate against the engine's limits
(prompt length vs max_model_len and the KV pool, token ids inside the vocabulary with vLLM's
"Token id N is out of vocabulary", logprobs vs max_logprobs, logit_bias / allowed_token_ids),
build the EngineCoreRequest, and fan a request with n > 1 out into its n children (vLLM does that
step in LLMEngine.add_request / AsyncLLM.add_request; both would call the same code, so it lives
here once). `resolve_engine_config` is the one place the EngineConfig is resolved (dtype "auto",
the KV sizes), so both engines and their EngineCore child run the same config.
Left out: multimodal inputs, LoRA, pooling params, structured output, tokenization_kwargs.
"""
from __future__ import annotations

import dataclasses
import time

from minivllm.config import EngineConfig
from minivllm.core.kv_cache_utils import resolve_sizes
from minivllm.core.sched.utils import check_request_fits
from minivllm.engine import EngineCoreRequest
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.models.loader import load_config, resolve_model
from minivllm.platforms import resolve_dtype
from minivllm.sampling_params import SEED_RANGE, SamplingParams, is_int


def resolve_engine_config(config: EngineConfig):
    """(config with dtype "auto" resolved, model folder, HF config): what LLMEngine and AsyncLLM both start from.

    An unsupported architecture, a size this machine cannot hold, or a missing CUDA device fails
    here, in the caller's process, before any EngineCore is started.
    """
    model_folder = resolve_model(config.model)
    hf_config = load_config(model_folder)
    dtype = resolve_dtype(config.dtype, getattr(hf_config, "dtype", None), config.device)
    config = dataclasses.replace(config, dtype=dtype)  # E.g. "auto" -> "bfloat16" on a CPU with AMX
    verify_with_parallel_config(hf_config, config.tensor_parallel_size)
    resolve_sizes(config, hf_config)
    if config.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' but torch sees no CUDA device: use device='cpu'.")
    return config, model_folder, hf_config


def verify_with_parallel_config(hf_config, tp: int) -> None:
    """As vLLM's ModelConfig.verify_with_parallel_config: every rank must get whole heads and whole MLP units."""
    heads = hf_config.num_attention_heads
    if heads % tp:
        raise ValueError(f"Total number of attention heads ({heads}) must be divisible by tensor parallel "
                         f"size ({tp}).")
    kv_heads = getattr(hf_config, "num_key_value_heads", None) or heads
    if kv_heads % tp and tp % kv_heads:  # more ranks than KV heads: each KV head is copied to tp/kv ranks
        raise ValueError(f"Total number of KV heads ({kv_heads}) and tensor parallel size ({tp}) must divide "
                         f"one another.")
    ffn = getattr(hf_config, "intermediate_size", None) or getattr(hf_config, "ffn_dim", None)
    if ffn and ffn % tp:
        raise ValueError(f"The MLP's intermediate size ({ffn}) must be divisible by tensor parallel size ({tp}).")


def short(value, limit: int = 24) -> str:
    """A value for an error message, cut to one short line: 10**4000 is not echoed digit by digit."""
    text = str(value)
    return text if len(text) <= limit else text[:limit] + f"...({len(text)} chars)"


def parse_prompt(prompt) -> tuple[str | None, list[int] | None]:
    """One prompt as (text, token ids): vLLM's TextPrompt / TokensPrompt forms. Exactly one may be None.

    E.g. "Hi" -> ("Hi", None); [1, 2] -> (None, [1, 2]); {"prompt": "Hi", "prompt_token_ids": [1]} -> ("Hi", [1]).
    """
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return prompt.get("prompt"), _token_list(prompt["prompt_token_ids"])
        if "prompt" not in prompt:
            raise ValueError(f"A dict prompt needs 'prompt' (text) or 'prompt_token_ids', got keys {sorted(prompt)}.")
        prompt = prompt["prompt"]
        if not isinstance(prompt, str):
            raise ValueError(f"A dict prompt's 'prompt' must be a string, got {type(prompt).__name__}.")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("The prompt is an empty string: pass some text or token ids.")
        return prompt, None
    return None, _token_list(prompt)


def _token_list(ids) -> list[int]:
    if not isinstance(ids, (list, tuple)):
        raise ValueError(f"Prompt token ids must be a list of ints, got {type(ids).__name__}.")
    return list(ids)


def parse_prompts(prompts) -> list:
    """One prompt or a batch of them as a list (vLLM's parse_and_batch_prompt), for LLM and /v1/completions.

    E.g. "Hi" -> ["Hi"]; [1, 2] -> [[1, 2]]; ["Hi", [1, 2], {"prompt": "Yo"}] -> as is.
    """
    if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                           and is_int(prompts[0])):
        return [prompts]
    if not isinstance(prompts, (list, tuple)) or not prompts:
        raise ValueError("No prompts given: pass a string, a list of strings, or lists of token ids.")
    for p in prompts:
        if not isinstance(p, (str, list, dict)):
            raise ValueError(f"A prompt must be a string, a list of token ids, or a dict with 'prompt' or "
                             f"'prompt_token_ids', got {type(p).__name__}.")
        if len(p) == 0:
            raise ValueError("A prompt is empty: pass some text or token ids.")
    return list(prompts)


class Processor:
    """Prompt + SamplingParams -> a validated EngineCoreRequest, the same for LLMEngine and AsyncLLM."""

    def __init__(self, config: EngineConfig, tokenizer, vocab_size: int, info: dict) -> None:
        self.config, self.tokenizer, self.vocab_size = config, tokenizer, vocab_size
        self.max_model_len = info["max_model_len"]
        self.block_size, self.num_gpu_blocks = info["block_size"], info["num_gpu_blocks"]

    @property
    def eos_token_id(self) -> int | None:
        return self.tokenizer.eos_token_id

    def process_inputs(self, request_id: str, prompt, params: SamplingParams, priority: int = 0,
                       arrival_time: float | None = None) -> tuple[str | None, EngineCoreRequest]:
        """Tokenize and validate; raise ValueError naming what to change. Nothing is sent yet.

        The request gets its own copy of `params` (EOS joins the ids min_tokens holds back, bad
        words are tokenized), so one SamplingParams serves many prompts and engines. A request
        with n > 1 stays one request here; `fan_out` makes its children.
        """
        if not isinstance(params, SamplingParams):
            raise ValueError(f"sampling_params must be SamplingParams, got {type(params).__name__}")
        if not is_int(priority):
            raise ValueError(f"priority must be an int (lower runs first), got {priority!r}")
        text, token_ids = parse_prompt(prompt)
        if token_ids is None:
            token_ids = self.tokenizer.encode(text)
        self._validate_model_inputs(token_ids)
        self.validate_params(params)
        check_request_fits(len(token_ids), params.max_tokens, self.max_model_len, self.block_size,
                           self.num_gpu_blocks)
        params = params.clone()
        params.update_from_generation_config(self.eos_token_id)
        params.update_from_tokenizer(self.tokenizer, self.vocab_size)
        arrival_time = time.time() if arrival_time is None else arrival_time
        return text, EngineCoreRequest(request_id, token_ids, params, self.eos_token_id, arrival_time, priority)

    def _validate_model_inputs(self, token_ids: list[int]) -> None:
        """vLLM's check and wording; a prompt far too long is refused by length first, not scanned id by id."""
        if len(token_ids) >= self.max_model_len:
            check_request_fits(len(token_ids), None, self.max_model_len, self.block_size, self.num_gpu_blocks)
        outside = next((t for t in token_ids if not (is_int(t) and 0 <= t < self.vocab_size)), None)
        if outside is not None and not is_int(outside):
            raise ValueError(f"Prompt token ids must be ints, got {short(repr(outside))}.")
        if outside is not None:
            raise ValueError(f"Token id {short(outside)} is out of vocabulary (the model's token ids are 0 to "
                             f"{self.vocab_size - 1}).")

    def validate_params(self, params: SamplingParams) -> None:
        """vLLM's _validate_params; public, so the server checks a request's params once for all its prompts."""
        vocab = self.vocab_size
        self._validate_logprobs(params.logprobs)
        self._validate_logprobs(params.prompt_logprobs, "prompt_logprobs")
        for name in ("logit_bias", "allowed_token_ids"):  # vLLM's _validate_logit_bias / _validate_allowed_token_ids
            outside = {t for t in (getattr(params, name) or ()) if t >= vocab}
            if outside:
                raise ValueError(f"SamplingParams.{name} has {len(outside)} token ids outside the vocabulary "
                                 f"[0, {vocab}), e.g. {short(min(outside))}.")
        k = params.num_samples
        if k > 1 and params.seed is not None and params.seed + k - 1 > SEED_RANGE[1]:
            raise ValueError(f"SamplingParams.seed={params.seed}: with {k} samples the children's seeds (seed + "
                             f"index) pass {SEED_RANGE[1]}; pick a smaller seed.")

    def _validate_logprobs(self, logprobs: int | None, name: str = "logprobs") -> None:
        """As vLLM: at most max_logprobs alternatives (-1 lifts the cap); logprobs=-1 means the whole vocabulary."""
        if logprobs is None:
            return
        vocab, max_logprobs = self.vocab_size, self.config.max_logprobs
        limit = vocab if max_logprobs == -1 else max_logprobs
        wanted = vocab if logprobs == -1 else logprobs
        if wanted > min(limit, vocab):
            raise ValueError(f"SamplingParams.{name}={logprobs} asks for {wanted} alternatives, more than allowed "
                             f"({min(limit, vocab)}: max_logprobs={max_logprobs}, vocabulary {vocab}). "
                             f"Lower {name}, or raise the engine argument max_logprobs (-1: no limit).")

    @staticmethod
    def fan_out(request: EngineCoreRequest) -> list[tuple[EngineCoreRequest, ParentRequest | None, int]]:
        """(child, parent, index) per sample: n > 1 becomes n children "{index}_{id}" (vLLM's ParentRequest)."""
        params = request.sampling_params
        if params.num_samples == 1:
            return [(request, None, 0)]
        parent = ParentRequest(request.request_id, params)
        children = []
        for index in range(params.num_samples):
            child_id, child_params = parent.get_child_info(index)
            children.append((dataclasses.replace(request, request_id=child_id, sampling_params=child_params),
                             parent, index))
        return children
