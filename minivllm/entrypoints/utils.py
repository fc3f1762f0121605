"""Mirror of vllm/entrypoints/utils.py: what the HTTP layer needs around a handler.

`with_cancellation` (vLLM's) cancels a handler whose client disconnected. RequestBodyLimit refuses a
body over the server's limit with a 413 OpenAI error before the body is read whole (vLLM leaves body
limits to a proxy; a 50 MB prompt would otherwise be parsed, then tokenized). `body_error_message`
says what is wrong with a body FastAPI could not parse; `find_lone_surrogate` finds a string that is
not valid Unicode (JSON's "\\ud800" escape). Left out: vLLM's CLI helpers.
"""
from __future__ import annotations

import asyncio
import functools
import json

from starlette.requests import Request


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


class RequestBodyLimit:
    """ASGI middleware: a body over `max_bytes` gets a 413 OpenAI error object.

    Nothing over the limit is kept: a body up to 4 times the limit is read and dropped first (so that
    the client, still sending, reads the 413 instead of a broken pipe); past that the connection is
    closed after the 413. The body read here is handed on whole; later receive() calls go through (so
    a handler still hears the client's disconnect).
    """

    def __init__(self, app, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def refuse(self, send, size: str) -> None:
        error = {"message": f"The request body is {size} bytes, more than this server's limit of {self.max_bytes} "
                            f"(--max-request-body-bytes).", "type": "RequestEntityTooLargeError", "param": None,
                 "code": 413}
        payload = json.dumps({"error": error}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload)),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": payload})

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length = dict(scope.get("headers", ())).get(b"content-length", b"")
        if length.isdigit() and int(length) > 4 * self.max_bytes:
            return await self.refuse(send, length.decode())
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client left before sending its body
            size += len(message.get("body", b""))
            if size > 4 * self.max_bytes or (size > self.max_bytes and not message.get("more_body", False)):
                return await self.refuse(send, str(size) if not message.get("more_body") else f"over {size}")
            if size <= self.max_bytes:
                chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body, handed = b"".join(chunks), False

        async def replay():
            nonlocal handed
            if not handed:
                handed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def find_lone_surrogate(data) -> str | None:
    """The path of the first string holding a lone surrogate (not encodable as UTF-8), or None.

    E.g. {"messages": [{"role": "\\ud800"}]} -> "messages.0.role". Iterative: any nesting depth the JSON
    parser accepted is walked without recursion.
    """
    stack = [("", data)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return path or "body"
        elif isinstance(value, dict):
            for key, item in value.items():
                name = str(key).encode("utf-8", "backslashreplace").decode()  # the path itself stays UTF-8
                stack.extend([(f"{path}.{name}" if path else name, item), (f"{path}.<key>" if path else "<key>", key)])
        elif isinstance(value, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(value))
    return None


def check_unicode(data) -> None:
    """ValueError (a 400) naming the field that holds a lone surrogate; one C-speed pass when there is none."""
    try:
        json.dumps(data, ensure_ascii=False).encode("utf-8")
        return
    except UnicodeEncodeError:
        path = find_lone_surrogate(data) or "body"
    raise ValueError(f"{path} holds a lone surrogate (e.g. \\ud800): not valid Unicode text, send UTF-8.")


def body_error_message(exc) -> str:
    """A starlette HTTPException in words: a body FastAPI could not parse says why (the cause it chained)."""
    cause = exc.__cause__
    if isinstance(cause, UnicodeDecodeError):
        return f"The request body is not valid UTF-8 ({cause.reason} at byte {cause.start}): send UTF-8 JSON."
    if isinstance(cause, RecursionError):
        return "The request body's JSON is nested too deep to parse: flatten it."
    if isinstance(cause, ValueError):
        return f"The request body is not valid JSON: {str(cause)[:200]}"
    if exc.status_code == 404:
        return ("Not Found: this server serves POST /v1/completions and /v1/chat/completions, GET /v1/models, "
                "/health and /metrics.")
    return str(exc.detail)[:300]
