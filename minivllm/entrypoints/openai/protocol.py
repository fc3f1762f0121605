"""Mirror of vllm/entrypoints/openai/protocol.py: the OpenAI API's requests and responses as pydantic models.

A request's sampling fields become one SamplingParams (`to_sampling_params`), whose own checks name
a bad value (a 400). As vLLM, the fields OpenAI lacks (top_k, min_p, min_tokens, ignore_eos, ...) come
through the body too (`extra_body` in the openai client), and unknown fields are ignored. As vLLM's
server: seed must fit int64, logit_bias is clamped to [-100, 100]. A lone surrogate ("\\ud800") in any
string is a 400. Refused by name (400) rather than ignored: tools, response_format, prompt_logprobs,
`echo`, `suffix`, `best_of` > 1; left out: multimodal content, beam search, embeddings. Where we differ
from vLLM: n <= MAX_N_SEQUENCES = 256 (vLLM's VLLM_MAX_N_SEQUENCES: 16384; here the parent folds all n
outputs every step) and a completion takes at most MAX_PROMPTS = 1024 prompts.
"""
from __future__ import annotations

import math
import time
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from minivllm.sampling_params import SamplingParams

MAX_N_SEQUENCES = 256  # samples per prompt (vLLM: VLLM_MAX_N_SEQUENCES, 16384)
MAX_PROMPTS = 1024  # prompts in one /v1/completions request
INT64 = (-(2**63), 2**63 - 1)  # vLLM's seed range (torch.long)
LOGIT_BIAS_RANGE = (-100.0, 100.0)  # vLLM's server clamps every bias into it
# fields vLLM serves and minivllm refuses, with the values that ask for nothing (accepted)
UNSERVED = {"response_format": [{"type": "text"}], "prompt_logprobs": [], "tools": [[]], "tool_choice": ["none"],
            "echo": [False], "suffix": [], "best_of": [1]}


def random_uuid() -> str:
    return uuid.uuid4().hex


class OpenAIBaseModel(BaseModel):
    model_config = ConfigDict(extra="ignore")


class ErrorInfo(OpenAIBaseModel):
    message: str
    type: str
    param: str | None = None
    code: int


class ErrorResponse(OpenAIBaseModel):
    error: ErrorInfo


class ModelCard(OpenAIBaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = Field(default_factory=lambda: int(time.time()))
    owned_by: str = "minivllm"
    root: str | None = None
    max_model_len: int | None = None


class ModelList(OpenAIBaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class StreamOptions(OpenAIBaseModel):
    include_usage: bool | None = True


class PromptTokenUsageInfo(OpenAIBaseModel):
    cached_tokens: int | None = None


class UsageInfo(OpenAIBaseModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0
    prompt_tokens_details: PromptTokenUsageInfo | None = None


class SamplingRequest(OpenAIBaseModel):
    """The sampling fields shared by /v1/completions and /v1/chat/completions (vLLM's extras included)."""
    model: str | None = None
    n: int = Field(1, ge=1, le=MAX_N_SEQUENCES)
    temperature: float | None = None  # None: the model's generation_config default, else 1.0
    top_p: float | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(None, ge=INT64[0], le=INT64[1])
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    logit_bias: dict[str, float] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # vLLM's extra sampling parameters
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    allowed_token_ids: list[int] | None = None
    bad_words: list[str] | None = None
    priority: int = 0
    # served by vLLM, not by minivllm: present only to be refused by name (UNSERVED), not silently ignored
    response_format: dict[str, Any] | None = None
    prompt_logprobs: int | None = None

    def _refuse_unsupported(self) -> None:
        """A field vLLM serves and minivllm does not is a 400 naming it, not silently ignored."""
        for name, harmless in UNSERVED.items():
            value = getattr(self, name, None)
            if value is not None and value not in harmless:
                raise ValueError(f"{name} is not supported by minivllm's server: leave it unset.")

    def _logit_bias(self) -> dict[int, float] | None:
        """As vLLM's server: keys are token ids written as strings, each bias clamped to [-100, 100]."""
        if not self.logit_bias:
            return None
        result, low, high = {}, *LOGIT_BIAS_RANGE
        for token, bias in self.logit_bias.items():
            try:
                token_id = int(token)
            except ValueError:
                raise ValueError(f"logit_bias keys must be token ids (integer strings); {token[:20]!r} is not "
                                 f"({len(self.logit_bias)} keys sent).") from None
            if not math.isfinite(bias):
                raise ValueError(f"logit_bias[{token[:20]!r}] = {bias}: a bias must be a finite number "
                                 f"(it is clamped to [{low:g}, {high:g}]).")
            result[token_id] = min(high, max(low, bias))
        return result

    def _sampling_params(self, max_tokens: int | None, logprobs: int | None, defaults: dict) -> SamplingParams:
        """As vLLM's to_sampling_params: a field left unset takes the model's default, then SamplingParams'."""
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options can only be set when stream is true.")
        names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
        picked = {name: getattr(self, name) for name in names}
        picked = {name: defaults.get(name) if value is None else value for name, value in picked.items()}
        picked = {name: value for name, value in picked.items() if value is not None}
        self._refuse_unsupported()
        logit_bias = self._logit_bias()
        return SamplingParams(
            n=self.n, presence_penalty=self.presence_penalty or 0.0, frequency_penalty=self.frequency_penalty or 0.0,
            seed=self.seed, stop=self.stop, stop_token_ids=self.stop_token_ids, max_tokens=max_tokens,
            min_tokens=self.min_tokens, ignore_eos=self.ignore_eos, logprobs=logprobs,
            skip_special_tokens=self.skip_special_tokens, include_stop_str_in_output=self.include_stop_str_in_output,
            logit_bias=logit_bias, allowed_token_ids=self.allowed_token_ids, bad_words=self.bad_words, **picked)


class CompletionRequest(SamplingRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False  # echo, suffix, best_of > 1: refused (UNSERVED)
    suffix: str | None = None
    best_of: int | None = None

    def to_sampling_params(self, defaults: dict) -> SamplingParams:
        return self._sampling_params(self.max_tokens, self.logprobs, defaults)


class ChatMessage(OpenAIBaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage]
    max_tokens: int | None = None  # deprecated by OpenAI for max_completion_tokens; None: up to max_model_len
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = 0
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None  # refused (UNSERVED)
    tool_choice: str | dict[str, Any] | None = None  # refused unless "none"

    def to_sampling_params(self, defaults: dict) -> SamplingParams:
        if self.top_logprobs and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs=true.")
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        return self._sampling_params(max_tokens, (self.top_logprobs or 0) if self.logprobs else None, defaults)


class CompletionLogProbs(OpenAIBaseModel):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(OpenAIBaseModel):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class CompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"cmpl-{random_uuid()}")
    object: str = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo | None = None


class ChatCompletionLogProb(OpenAIBaseModel):
    token: str
    logprob: float = -9999.0
    bytes: list[int] | None = None


class ChatCompletionLogProbsContent(ChatCompletionLogProb):
    top_logprobs: list[ChatCompletionLogProb] = Field(default_factory=list)


class ChatCompletionLogProbs(OpenAIBaseModel):
    content: list[ChatCompletionLogProbsContent] | None = None


class ChatResponseMessage(OpenAIBaseModel):
    role: str | None = None
    content: str | None = None


class ChatCompletionResponseChoice(OpenAIBaseModel):
    index: int
    message: ChatResponseMessage | None = None  # in a full response
    delta: ChatResponseMessage | None = None  # in a stream chunk
    logprobs: ChatCompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None


class ChatCompletionResponse(OpenAIBaseModel):
    id: str = Field(default_factory=lambda: f"chatcmpl-{random_uuid()}")
    object: str = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo | None = None
