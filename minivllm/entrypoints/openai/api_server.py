"""Mirror of vllm/entrypoints/openai/api_server.py (and cli_args.py): `minivllm serve`, an OpenAI-compatible server.

FastAPI routes over one AsyncLLM, served by uvicorn: POST /v1/completions and /v1/chat/completions
(whole, or streamed as Server-Sent Events), GET /v1/models, /health (200, or 503 once EngineCore is
dead), /metrics (Prometheus text) and, with --enable-trace-page only, /trace (minivllm's live trace
viewer, entrypoints/openai/trace_page.py; vLLM has none). Every failure is an OpenAI error object with its status (also
404, 405, a body that is not JSON, and a body over --max-request-body-bytes: 413, refused before it is
read whole); a request that fails leaves the engine serving the others. A client that disconnects
cancels its handler (streamed: EventStreamResponse; whole: `with_cancellation`), which aborts its
request before EngineCore's next step. SIGTERM or Ctrl-C: uvicorn stops accepting and lets requests
finish for 5 s; 1 s before that ends, each request still running gets a 503 error (a stream: an error
event, then [DONE]); then the lifespan's exit shuts EngineCore and the template renderer down. Where we
differ from vLLM: --host defaults to 127.0.0.1 (vLLM: every interface); the body limit. Slow clients:
uvicorn closes an idle keep-alive connection after 5 s and h11 caps a request head at 16 KiB, but
there is no timeout on reading a request head (slowloris): put a proxy in front of a public server.
Left out: API keys, CORS, SSL, tokenize/detokenize, embeddings, LoRA routes.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
from http import HTTPStatus

import anyio
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.entrypoints.openai.cli_args import (DEFAULT_MAX_REQUEST_BODY_BYTES, DEFAULT_TRACE_MAX_STEPS,
                                                  check_trace_page_args)
from minivllm.entrypoints.openai.protocol import ChatCompletionRequest, CompletionRequest, ModelCard, ModelList
from minivllm.entrypoints.openai.serving_chat import OpenAIServingChat
from minivllm.entrypoints.openai.serving_completion import OpenAIServingCompletion
from minivllm.entrypoints.openai.serving_engine import (ServerShuttingDownError, create_error_response,
                                                        error_from_exception)
from minivllm.entrypoints.utils import RequestBodyLimit, body_error_message, check_unicode, with_cancellation
from minivllm.utils.gc_utils import freeze_gc_heap

GRACEFUL_SHUTDOWN_S = 5  # uvicorn's wait for requests at SIGTERM; they get a 503 one second before it ends

def error_json(error) -> JSONResponse:
    return JSONResponse(error.model_dump(), status_code=error.error.code)


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


def fail_running_requests(engine: AsyncLLM) -> None:
    """The grace period is ending: every request still running answers 503 (a stream: an error event, [DONE])."""
    error = ServerShuttingDownError("The server is shutting down (SIGTERM): this request was stopped; retry "
                                    "on a server that is up.")
    for collector in list(engine.collectors.values()):
        collector.put(error)


def build_app(engine: AsyncLLM, trust_request_chat_template: bool = False,
              max_request_body_bytes: int = DEFAULT_MAX_REQUEST_BODY_BYTES, *, enable_trace_page: bool = False,
              trace_page_show_requests: bool = False, trace_max_steps: int = DEFAULT_TRACE_MAX_STEPS,
              host: str = "127.0.0.1") -> FastAPI:
    """The server's routes over `engine`; the live trace page only with enable_trace_page (off: /trace is a 404),
    which logs what it exposes, and warns when `host` (where the server listens) is not loopback."""
    check_trace_page_args(enable_trace_page, trace_page_show_requests)
    name = engine.served_model_name
    completion = OpenAIServingCompletion(engine, name)
    chat = OpenAIServingChat(engine, name, trust_request_chat_template)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.loop = asyncio.get_running_loop()
        app.state.engine = engine
        freeze_gc_heap()  # as vLLM's server: the app and its engine client are built for good
        yield
        chat.shutdown()
        engine.shutdown()  # the server is stopping: stop EngineCore with it
        gc.unfreeze()  # a server run in a thread (tests, notebooks) leaves its process collectable again

    app = FastAPI(title="minivllm", lifespan=lifespan)
    app.add_middleware(RequestBodyLimit, max_bytes=max_request_body_bytes)
    app.state.live_trace = None  # the LiveTraceHub, with the page on
    if enable_trace_page:
        from minivllm.entrypoints.openai.trace_page import add_trace_routes, announce_trace_page
        app.state.live_trace = add_trace_routes(app, engine, EventStreamResponse, trace_max_steps,
                                                trace_page_show_requests)
        announce_trace_page(host, trace_page_show_requests)

    @app.exception_handler(RequestValidationError)
    async def validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":
            return error_json(create_error_response(
                f"The body is not valid JSON: {first.get('ctx', {}).get('error', 'decode error')} at position "
                f"{first.get('loc', ('', '?'))[-1]}."))
        param = ".".join(str(p) for p in first.get("loc", ())[1:]) or None
        message = first.get("msg", "invalid request")
        return error_json(create_error_response(f"{param}: {message}" if param else message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        """404, 405, and a body FastAPI could not parse (invalid UTF-8, nested too deep, a huge integer)."""
        return error_json(create_error_response(body_error_message(exc), exc.status_code))

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
            await engine.run_in_input_thread(check_unicode, body.model_dump(exclude_none=True))  # off the loop
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


def run_server(args: argparse.Namespace) -> int | None:
    from minivllm.logger import init_logger
    init_logger()
    if args.model_tag is not None:
        args.model = args.model_tag
    check_trace_page_args(args.enable_trace_page, args.trace_page_show_requests)  # before the model loads
    if args.headless:  # this node's tensor-parallel workers only
        from minivllm.executor.multiproc_executor import run_headless
        return run_headless(EngineArgs.from_cli_args(args))
    engine = AsyncLLM.from_engine_args(EngineArgs.from_cli_args(args), args.served_model_name)
    app = build_app(engine, args.trust_request_chat_template, args.max_request_body_bytes,
                    enable_trace_page=args.enable_trace_page, trace_page_show_requests=args.trace_page_show_requests,
                    trace_max_steps=args.trace_max_steps, host=args.host)
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=args.uvicorn_log_level,
                            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S)
    try:
        asyncio.run(serve_http(uvicorn.Server(config), engine))
    finally:
        engine.shutdown()


async def serve_http(server: uvicorn.Server, engine: AsyncLLM | None = None) -> None:
    """As vLLM's serve_http: SIGTERM and SIGINT stop the server gracefully and the process exits 0.

    (uvicorn's own handlers re-raise the signal once it has stopped, so the process would end by it.)
    One second before uvicorn's grace period ends, the requests still running are failed with a 503,
    so that a stream ends with an error event and [DONE] instead of a cut connection.
    """
    loop = asyncio.get_running_loop()
    server.capture_signals = contextlib.nullcontext  # ours, below, instead of uvicorn's

    def stop(sig) -> None:
        server.handle_exit(sig, None)
        if engine is not None:
            loop.call_later(max(0, server.config.timeout_graceful_shutdown - 1), fail_running_requests, engine)

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop, sig)
    await server.serve()


class ServerThread:
    """The server on a background thread of this process (tests and the serve trace use it), on a free port.

    `url` is the /v1 base for the openai client. `stop()` asks uvicorn to exit (as SIGTERM would) and
    joins; the lifespan's exit then shuts the engine down.
    """

    def __init__(self, engine: AsyncLLM, host: str = "127.0.0.1", log_level: str = "warning", **app_kwargs) -> None:
        import socket
        import threading
        self.engine = engine
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.bind((host, 0))
        port = self.socket.getsockname()[1]
        self.url = f"http://{host}:{port}/v1"
        self.app = build_app(engine, host=host, **app_kwargs)
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
