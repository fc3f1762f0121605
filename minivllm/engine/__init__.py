"""Mirror of vllm/v1/engine/__init__.py: the messages that cross the process boundary.

Each message is one small dataclass, and the receiver dispatches on its type (vLLM sends an
EngineCoreRequestType tag with a msgpack payload over ZMQ; a typed message says the same with its
fields named). Caller -> EngineCore, over the input queue: AddRequests, AbortRequests, UtilityCall,
Shutdown. EngineCore -> caller, over the output pipe: EngineCoreReady, EngineCoreOutputs (one step's),
UtilityOutput, EngineCoreFailed, and TraceEvents, which only a traced engine sends, ahead of the
outputs of the step it describes. Left out: msgspec, multimodal features, data-parallel waves.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minivllm.sampling_params import SamplingParams


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


# Caller -> EngineCore
@dataclass
class AddRequests:
    requests: list[EngineCoreRequest]  # admitted together, before the next step


@dataclass
class AbortRequests:
    request_ids: list[str]


@dataclass
class UtilityCall:
    call_id: int
    method: str  # an EngineCore method, run between two steps
    args: tuple = ()


@dataclass
class Shutdown:
    pass


# EngineCore -> caller (and EngineCoreOutputs above)
@dataclass
class EngineCoreReady:
    info: dict[str, Any]  # EngineCore.info(): sizes, attention backend, pid


@dataclass
class UtilityOutput:
    call_id: int
    failure_message: str | None = None  # the method raised: the engine lives on, the caller gets this
    result: Any = None


@dataclass
class EngineCoreFailed:
    message: str
    refused: bool  # True: EngineCore rejected bad input (the caller raises ValueError), False: it crashed


@dataclass
class TraceEvents:
    events: list[dict[str, Any]]  # what a tracing observer recorded, sent before the step's outputs
