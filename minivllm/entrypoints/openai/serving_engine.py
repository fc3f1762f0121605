"""Mirror of vllm/entrypoints/openai/serving_engine.py (and serving_models.py): what both endpoints share.

OpenAIServing checks the model name, checks params with the engine's own Processor (engine/processor.py,
the front end LLM uses too), tokenizes a prompt on the engine's tokenizer thread, fits
max_tokens to max_model_len as vLLM's server does (null: up to max_model_len; prompt + max_tokens over
it: a 400), turns an exception into an OpenAI error object with its HTTP status, counts usage, and
frames a stream as Server-Sent Events. Errors: a bad field or prompt is a ValueError -> 400
BadRequestError; an unknown model 404 NotFoundError; a dead EngineCore 500 InternalServerError; a
server shutting down 503. A 500 tells the client one line; its traceback goes to the server's log only.
A text prompt longer than max_model_len tokens could ever spell (at most the longest token's length per
token) is refused before it is tokenized. Left out: LoRA adapters, served-model aliases, request logging,
tokenization endpoints.
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
from http import HTTPStatus
from typing import AsyncGenerator, AsyncIterator

from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.core_client import EngineDeadError
from minivllm.engine.processor import short
from minivllm.entrypoints.openai.protocol import (ErrorInfo, ErrorResponse, PromptTokenUsageInfo, UsageInfo,
                                                  random_uuid)
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

logger = logging.getLogger("minivllm")


class ModelNotFoundError(ValueError):
    pass


class ServerShuttingDownError(RuntimeError):
    """Put into every request still running when the server's grace period ends (SIGTERM): a 503."""


def create_error_response(message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                          param: str | None = None) -> ErrorResponse:
    """E.g. 400 -> type "BadRequestError", 413 -> "RequestEntityTooLargeError", 500 -> "InternalServerError"."""
    status = HTTPStatus(status)
    kind = status.phrase.title().replace(" ", "").replace("-", "").removesuffix("Error") + "Error"
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=int(status)))


def error_from_exception(e: BaseException) -> ErrorResponse:
    if isinstance(e, ModelNotFoundError):
        return create_error_response(str(e), HTTPStatus.NOT_FOUND, "model")
    if isinstance(e, ServerShuttingDownError):
        return create_error_response(str(e), HTTPStatus.SERVICE_UNAVAILABLE)
    if isinstance(e, ValueError):
        return create_error_response(str(e))
    if isinstance(e, EngineDeadError):  # its cause was logged where it was received (engine/exceptions.py)
        return create_error_response(first_line(f"EngineCore is dead: {e}"), HTTPStatus.INTERNAL_SERVER_ERROR)
    logger.error("A request failed with an unexpected error", exc_info=e)  # the traceback: the server's log only
    return create_error_response(first_line(f"{type(e).__name__}: {e}"), HTTPStatus.INTERNAL_SERVER_ERROR)


def first_line(message: str) -> str:
    """What a client is told of a server error: one line, never a traceback (that goes to the server's log)."""
    return message.strip().split("\n", 1)[0].rstrip(":")


def sse(payload: str) -> str:
    """One Server-Sent Event: `data: {json}` and a blank line."""
    return f"data: {payload}\n\n"


async def merge_async_iterators(*iterators: AsyncIterator) -> AsyncGenerator[tuple[int, object], None]:
    """vLLM's: yield (i, item) from several async iterators as items arrive; closing it cancels them all."""
    queue: asyncio.Queue = asyncio.Queue()
    done = object()

    async def drain(i: int, iterator: AsyncIterator) -> None:
        try:
            async for item in iterator:
                await queue.put((i, item))
            await queue.put((i, done))
        except Exception as e:
            await queue.put((i, e))

    tasks = [asyncio.create_task(drain(i, it)) for i, it in enumerate(iterators)]
    try:
        remaining = len(tasks)
        while remaining:
            i, item = await queue.get()
            if item is done:
                remaining -= 1
            elif isinstance(item, Exception):
                raise item
            else:
                yield i, item
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)  # each generate()'s finally aborts its request


class AbortOnClose:
    """A stream's chunks plus the requests behind them: closing it aborts those still running.

    The HTTP response closes its body when the client leaves, also before the first chunk, when
    the generator never started and so never reached its own `finally`.
    """

    def __init__(self, chunks: AsyncGenerator[str, None], engine_client: AsyncLLM, request_ids: list[str]) -> None:
        self.chunks, self.engine_client, self.request_ids = chunks, engine_client, request_ids

    def __aiter__(self) -> AsyncGenerator[str, None]:
        return self.chunks

    async def aclose(self) -> None:
        await self.chunks.aclose()
        self.engine_client.abort(self.request_ids)


@functools.lru_cache(maxsize=4)
def max_chars_per_token(tokenizer) -> int:
    """The longest token's text: a prompt of N tokens has at most N times this many characters (SmolLM2: 81)."""
    return max(len(text) for text in tokenizer.batch_decode([[i] for i in range(len(tokenizer))]))


class OpenAIServing:
    def __init__(self, engine_client: AsyncLLM, served_model_name: str) -> None:
        self.engine_client = engine_client
        self.served_model_name = served_model_name
        self.default_sampling_params = dict(engine_client.sampling_overrides)
        self.max_model_len = engine_client.info["max_model_len"]
        # a margin of 2 for tokenizers that normalize (strip, merge spaces) before they split
        self.max_prompt_chars = 2 * self.max_model_len * max_chars_per_token(engine_client.tokenizer)

    def check_params(self, params: SamplingParams) -> None:
        """The engine's own checks (engine/processor.py), before any prompt of the request is submitted."""
        self.engine_client.processor.validate_params(params)

    async def prepare_prompt(self, prompt: str | list[int], params: SamplingParams,
                             add_special_tokens: bool = True) -> tuple[dict, SamplingParams]:
        """Tokenize (off the event loop) and fit max_tokens: ({"prompt", "prompt_token_ids"}, params).

        As vLLM's server: max_tokens null means max_model_len - prompt tokens; a prompt plus max_tokens
        over max_model_len is a 400, not silently capped.
        """
        if isinstance(prompt, str):
            if len(prompt) > self.max_prompt_chars:
                raise ValueError(f"The prompt has {len(prompt)} characters, more than max_model_len="
                                 f"{self.max_model_len} tokens can hold: shorten it.")
            tokenizer = self.engine_client.tokenizer
            encode = functools.partial(tokenizer.encode, add_special_tokens=add_special_tokens)
            text, token_ids = prompt, await self.engine_client.run_in_input_thread(encode, prompt)
        else:  # ids out of vocabulary: the engine's Processor says so, in vLLM's words
            text, token_ids = None, prompt
        num_tokens, max_len = len(token_ids), self.max_model_len
        if num_tokens >= max_len:
            raise ValueError(f"This model's maximum context length is {max_len} tokens, but the prompt has "
                             f"{num_tokens}: shorten it below {max_len} tokens to leave room for the output.")
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=max_len - num_tokens)
        elif num_tokens + params.max_tokens > max_len:
            raise ValueError(f"max_tokens={short(params.max_tokens)} is too large: this model's maximum context "
                             f"length is {max_len} tokens and the prompt has {num_tokens} ({short(params.max_tokens)}"
                             f" > {max_len} - {num_tokens}). Lower max_tokens, or leave it null for up to "
                             f"max_model_len.")
        return {"prompt": text, "prompt_token_ids": token_ids}, params

    def check_model(self, model: str | None) -> None:
        if model is not None and model != self.served_model_name:
            raise ModelNotFoundError(f"The model `{model}` does not exist: this server serves "
                                     f"`{self.served_model_name}` (GET /v1/models).")

    @staticmethod
    def request_id(prefix: str, header: str | None = None) -> str:
        """As vLLM: `{prefix}-{X-Request-Id header}` when the client sent one, else a random id."""
        return f"{prefix}-{header or random_uuid()}"

    @staticmethod
    def usage(outputs: list[RequestOutput]) -> UsageInfo:
        """prompt, completion and total tokens over every prompt and sample; cached tokens from the prefix cache."""
        prompt = sum(len(o.prompt_token_ids) for o in outputs)
        completion = sum(len(c.token_ids) for o in outputs for c in o.outputs)
        cached = sum(o.num_cached_tokens or 0 for o in outputs)
        return UsageInfo(prompt_tokens=prompt, completion_tokens=completion, total_tokens=prompt + completion,
                         prompt_tokens_details=PromptTokenUsageInfo(cached_tokens=cached))

    @staticmethod
    def stream_error(e: BaseException) -> str:
        """An error after the stream has started: vLLM sends it as one more event, then [DONE]."""
        return sse(json.dumps(error_from_exception(e).model_dump()))
