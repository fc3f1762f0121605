"""Mirror of vllm/outputs.py and vllm/v1/outputs.py: what the engine returns.

RequestOutput/CompletionOutput are what `LLM.generate` hands the caller;
ModelRunnerOutput is what the model runner hands the scheduler each step.
With n > 1 a RequestOutput holds n CompletionOutputs, one per sample (index 0..n-1).
Left out: pooling outputs, metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Logprob:
    logprob: float
    rank: int | None = None  # 1 = the most likely token
    decoded_token: str | None = None


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None  # "stop" | "length" | "abort" | None while running
    stop_reason: int | str | None = None  # the stop string or stop token id that ended it
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None  # sum of the sampled tokens' logprobs (when logprobs are asked for)

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    # with SamplingParams.prompt_logprobs: one entry per prompt token, None for the first (nothing predicts it)
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int | None = None  # prompt tokens served from the prefix cache (vLLM's field)


@dataclass
class ModelRunnerOutput:
    req_ids: list[str]
    req_id_to_index: dict[str, int]
    # one list per request; empty for a partial prefill chunk, which samples nothing
    sampled_token_ids: list[list[int]]
    # per request, per token: (logprob, rank, [(token_id, logprob), ...]) when asked for
    logprobs: list[list[tuple[float, int, list[tuple[int, float]]]] | None] | None = None
    # req_id -> per prompt position 1.. (logprob, rank, [(token_id, logprob), ...]) of the prompt token there;
    # sent once, in the step that computes the prompt's last chunk (with its first sampled token)
    prompt_logprobs_dict: dict[str, list[tuple[float, int, list[tuple[int, float]]]]] = field(default_factory=dict)


@dataclass
class DraftTokenIds:
    """Speculative decoding: the drafts the runner proposed for each request's next step, handed to the
    scheduler after the step (EngineCore.post_step -> executor.take_draft_token_ids)."""
    req_ids: list[str]
    draft_token_ids: list[list[int]]
