"""Mirror of vllm/v1/engine/exceptions.py: the error a caller gets once the engine cannot go on."""
from __future__ import annotations

import logging
import re

logger = logging.getLogger("minivllm")


class EngineDeadError(RuntimeError):
    """EngineCore, or one of its worker processes, died; the engine cannot continue.

    Its message is one line. As vLLM's (whose message says "See stack trace (above) for the root cause"), the
    traceback of what failed goes to the log (`log_traceback`), never into the message: a server hands the
    message to its clients, and a traceback would show them the server's source paths."""


def log_traceback(where: str, text: str) -> str:
    """A traceback sent from another process (EngineCore, a tensor-parallel worker): log it here, whole, and
    return its last line, the exception itself (e.g. "RuntimeError: Connection closed by peer")."""
    logger.error("%s failed:\n%s", where, text.rstrip())
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return re.sub(r"^(?:\w+\.)+(?=\w+: )", "", lines[-1]) if lines else "an error with no message"  # no module path
