"""Mirror of vllm/v1/engine/utils.py: starting and stopping EngineCore's child process.

`child_setup` is the context a child is started in (no re-run of the caller's script, deaf to the
terminal's Ctrl-C); `stop_process` asks a child to shut down and kills it if it will not.
Left out: vLLM's CoreEngineProcManager for several engines, ZMQ handshakes.
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading

from minivllm.engine import Shutdown


def stop_process(process, input_queue) -> None:
    if process.is_alive():
        try:
            input_queue.put(Shutdown())
        except (OSError, ValueError):
            pass
        process.join(timeout=3)
    if process.is_alive():
        process.kill()
        process.join(timeout=3)
    input_queue.close()


@contextlib.contextmanager
def child_setup():
    """Start the child without re-running the caller's script, and deaf to the terminal's Ctrl-C.

    A spawned child normally re-imports the caller's __main__ (which is why scripts need an
    `if __name__ == "__main__":` guard). EngineCore needs nothing from it, so while the child is
    being started we hide where __main__ came from, and a plain script just works. SIGINT is
    ignored meanwhile (in the main thread), and an ignored signal stays ignored across exec, so
    a Ctrl-C reaches only the caller even while the child is still importing.
    """
    main = sys.modules.get("__main__")
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if main is not None and k in main.__dict__}
    in_main_thread = threading.current_thread() is threading.main_thread()
    old_sigint = signal.signal(signal.SIGINT, signal.SIG_IGN) if in_main_thread else None
    try:
        for key in saved:
            setattr(main, key, None) if key == "__spec__" else delattr(main, key)
        yield
    finally:
        for key, value in saved.items():
            setattr(main, key, value)
        if in_main_thread:
            signal.signal(signal.SIGINT, old_sigint)
