"""Mirror of vllm/entrypoints/openai/serving_engine.py (and serving_models.py): what both endpoints share.

OpenAIServing checks the model name, turns an exception into an OpenAI error object with its HTTP
status, counts usage, and frames a stream as Server-Sent Events. Errors: a bad field or prompt is a
ValueError -> 400 BadRequestError; an unknown model 404 NotFoundError; a dead EngineCore 500
InternalServerError. Left out: LoRA adapters, served-model aliases, request logging, tokenization
endpoints.
"""
from __future__ import annotations

import asyncio
import json
from http import HTTPStatus
from typing import AsyncGenerator, AsyncIterator

from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.core_client import EngineDeadError
from minivllm.entrypoints.openai.protocol import (ErrorInfo, ErrorResponse, PromptTokenUsageInfo, UsageInfo,
                                                  random_uuid)
from minivllm.outputs import RequestOutput


class ModelNotFoundError(ValueError):
    pass


def create_error_response(message: str, status: HTTPStatus = HTTPStatus.BAD_REQUEST,
                          param: str | None = None) -> ErrorResponse:
    kind = {HTTPStatus.BAD_REQUEST: "BadRequestError", HTTPStatus.NOT_FOUND: "NotFoundError",
            HTTPStatus.SERVICE_UNAVAILABLE: "ServiceUnavailableError"}.get(status, "InternalServerError")
    return ErrorResponse(error=ErrorInfo(message=message, type=kind, param=param, code=int(status)))


def error_from_exception(e: BaseException) -> ErrorResponse:
    if isinstance(e, ModelNotFoundError):
        return create_error_response(str(e), HTTPStatus.NOT_FOUND, "model")
    if isinstance(e, ValueError):
        return create_error_response(str(e))
    if isinstance(e, EngineDeadError):
        return create_error_response(f"EngineCore is dead: {e}", HTTPStatus.INTERNAL_SERVER_ERROR)
    return create_error_response(f"{type(e).__name__}: {e}", HTTPStatus.INTERNAL_SERVER_ERROR)


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


class OpenAIServing:
    def __init__(self, engine_client: AsyncLLM, served_model_name: str) -> None:
        self.engine_client = engine_client
        self.served_model_name = served_model_name
        self.default_sampling_params = dict(engine_client.sampling_overrides)

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
