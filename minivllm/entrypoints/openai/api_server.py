"""Mirror of vllm/entrypoints/openai/api_server.py (and cli_args.py): `minivllm serve`, an OpenAI-compatible server.

FastAPI routes over one AsyncLLM, served by uvicorn: POST /v1/completions and /v1/chat/completions
(whole, or streamed as Server-Sent Events), GET /v1/models, /health (200, or 503 once EngineCore is
dead) and /metrics (Prometheus text). Every failure is an OpenAI error object with its status; a
request that fails leaves the engine serving the others. A client that disconnects cancels its
handler (streamed: EventStreamResponse; whole: `with_cancellation`), which aborts its request
before EngineCore's next step. SIGTERM or Ctrl-C: uvicorn stops accepting, finishes what it can for 5 s, and the
lifespan's exit shuts EngineCore down. Where we differ from vLLM: --host defaults to 127.0.0.1
(vLLM: every interface). Left out: API keys, CORS, SSL, tokenize/detokenize, embeddings, LoRA routes.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import signal
from http import HTTPStatus

import anyio
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.serving_engine import create_error_response, error_from_exception

def error_json(error) -> JSONResponse:
    return JSONResponse(error.model_dump(), status_code=error.error.code)


async def listen_for_disconnect(request: Request) -> None:
    """Return when the client closes the connection (the body is already read, so only disconnect arrives)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def with_cancellation(handler):
    """vLLM's decorator: run the handler against the client's disconnect; a disconnect cancels it (and aborts)."""
    @functools.wraps(handler)
    async def wrapper(body, raw_request: Request):
        work = asyncio.create_task(handler(body, raw_request))
        gone = asyncio.create_task(listen_for_disconnect(raw_request))
        done, pending = await asyncio.wait([work, gone], return_when=asyncio.FIRST_COMPLETED)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        return work.result() if work in done else None
    return wrapper


class EventStreamResponse(StreamingResponse):
    """A text/event-stream that stops the moment its client disconnects, even between two chunks.

    Starlette listens for the disconnect only under ASGI spec < 2.4; under 2.4 (uvicorn's) it notices
    only when a send fails, leaving the generator suspended. Here the stream always races the
    disconnect and the generator is closed at the end, so its request is aborted before the next step.
    """

    def __init__(self, content) -> None:
        super().__init__(content, media_type="text/event-stream")

    async def __call__(self, scope, receive, send) -> None:
        async def stream() -> None:
            with contextlib.suppress(OSError):  # the client went away mid-send
                await self.stream_response(send)
            tasks.cancel_scope.cancel()

        try:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(stream)
                await self.listen_for_disconnect(receive)
                tasks.cancel_scope.cancel()
        finally:
            await self.body_iterator.aclose()


def build_app(engine: AsyncLLM) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.loop = asyncio.get_running_loop()
        yield
        engine.shutdown()  # the server is stopping: stop EngineCore with it

    app = FastAPI(title="minivllm", lifespan=lifespan)
    name = engine.served_model_name
    completion, chat = OpenAIServingCompletion(engine, name), OpenAIServingChat(engine, name)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        return error_json(create_error_response(f"{param}: {first.get('msg', str(exc))}" if param else str(exc),
                                                param=param))

    @app.get("/health")
    async def health() -> Response:
        try:
            await engine.check_health()
        except Exception as e:
            return error_json(create_error_response(str(e), HTTPStatus.SERVICE_UNAVAILABLE))
        return Response(status_code=200)

    @app.get("/v1/models")
    async def models() -> ModelList:
        return ModelList(data=[ModelCard(id=name, root=str(engine.model_folder),
                                         max_model_len=engine.info["max_model_len"])])

    @app.get("/metrics")
    async def metrics() -> Response:
        try:
            stats = await engine.get_stats_async()
        except Exception as e:
            return error_json(error_from_exception(e))
        return Response(engine.stat_logger.render(stats), media_type="text/plain; version=0.0.4; charset=utf-8")

    async def respond(create, body, raw_request: Request) -> Response:
        try:
            result = await create(body, raw_request.headers.get("X-Request-Id"))
        except Exception as e:
            return error_json(error_from_exception(e))
        if body.stream:
            return EventStreamResponse(result)
        return JSONResponse(result.model_dump(exclude_none=True))

    @app.post("/v1/completions")
    @with_cancellation
    async def create_completion(body: CompletionRequest, raw_request: Request) -> Response:
        return await respond(completion.create_completion, body, raw_request)

    @app.post("/v1/chat/completions")
    @with_cancellation
    async def create_chat_completion(body: ChatCompletionRequest, raw_request: Request) -> Response:
        return await respond(chat.create_chat_completion, body, raw_request)

    return app


def run_server(args: argparse.Namespace) -> None:
    from minivllm.logger import init_logger
    init_logger()
    if args.model_tag is not None:
        args.model = args.model_tag
    engine = AsyncLLM.from_engine_args(EngineArgs.from_cli_args(args), args.served_model_name)
    config = uvicorn.Config(build_app(engine), host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=5)
    try:
        asyncio.run(serve_http(uvicorn.Server(config)))
    finally:
        engine.shutdown()


async def serve_http(server: uvicorn.Server) -> None:
    """As vLLM's serve_http: SIGTERM and SIGINT stop the server gracefully and the process exits 0.

    (uvicorn's own handlers re-raise the signal once it has stopped, so the process would end by it.)
    """
    loop = asyncio.get_running_loop()
    server.capture_signals = contextlib.nullcontext  # ours, below, instead of uvicorn's
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, server.handle_exit, sig, None)
    await server.serve()


class ServerThread:
    """The server on a background thread of this process (tests and the serve trace use it), on a free port.

    `url` is the /v1 base for the openai client. `stop()` asks uvicorn to exit (as SIGTERM would) and
    joins; the lifespan's exit then shuts the engine down.
    """

    def __init__(self, engine: AsyncLLM, host: str = "127.0.0.1", log_level: str = "warning") -> None:
        import socket
        import threading
        self.engine = engine
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind((host, 0))
        port = self.socket.getsockname()[1]
        self.url = f"http://{host}:{port}/v1"
        self.app = build_app(engine)
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level=log_level,
                                                    timeout_graceful_shutdown=5))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]},
                                       name="uvicorn", daemon=True)
        self.thread.start()
        while not self.server.started:
            if not self.thread.is_alive():
                raise RuntimeError("the server thread exited before it started; its log says why")
            self.thread.join(timeout=0.05)

    def run_coroutine(self, coro, timeout: float = 60):
        """Run a coroutine on the server's event loop (e.g. engine.get_stats_async()) and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.app.state.loop).result(timeout)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.socket.close()
