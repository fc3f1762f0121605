"""Mirror of vllm/v1/engine/__init__.py: the messages that cross the process boundary.

Every message is a pair (type, payload). Caller -> EngineCore, over the input
queue: an EngineCoreRequestType (as vLLM's) with its payload; EngineCore ->
caller, over the output pipe: an EngineCoreOutputType with its payload. The
payloads are plain dataclasses and lists, so they pickle cheaply.
Left out: msgspec, multimodal features.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from minivllm.sampling_params import SamplingParams


class EngineCoreRequestType(enum.Enum):
    ADD = "ADD"  # payload: list[EngineCoreRequest], admitted together before the next step
    ABORT = "ABORT"  # payload: list of request ids
    UTILITY = "UTILITY"  # payload: (call_id, method name, args) of an EngineCore method
    SHUTDOWN = "SHUTDOWN"  # payload: None


class EngineCoreOutputType(enum.Enum):
    READY = "READY"  # payload: EngineCore.info()
    OUTPUTS = "OUTPUTS"  # payload: EngineCoreOutputs of one step
    UTILITY = "UTILITY"  # payload: (call_id, error message or None, result)
    ERROR = "ERROR"  # payload: (message, refused): refused = the child rejected bad input, a ValueError


@dataclass
class EngineCoreRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_id: int | None
    arrival_time: float
    priority: int = 0


@dataclass
class EngineCoreOutput:
    request_id: str
    new_token_ids: list[int]
    # per new token: (sampled logprob, sampled rank, [(token_id, logprob), ...] top alternatives)
    new_logprobs: list[tuple[float, int, list[tuple[int, float]]]] | None = None
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    stop_reason: int | str | None = None
    # once per request asking for prompt_logprobs: per prompt position 1.., same entries as new_logprobs
    new_prompt_logprobs: list[tuple[float, int, list[tuple[int, float]]]] | None = None
    num_cached_tokens: int = 0  # prompt tokens found in the prefix cache at the request's first admission

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineCoreOutputs:
    outputs: list[EngineCoreOutput] = field(default_factory=list)
    # trace events recorded during the steps behind these outputs (empty unless tracing)
    trace_events: list[dict[str, Any]] = field(default_factory=list)
