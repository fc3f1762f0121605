"""Tracing: watch one request travel the article's path, from the engine's real state.

`tracer.py` records (EngineTracer, a Scheduler observer inside EngineCore, plus
`describe_execute`, run in each worker); `trace.py` holds Trace in the caller;
`render.py` prints; `cli.py` is `python -m minivllm trace`. Tracing observes
and never changes what the engine does: the same tokens come out with it on or off.
"""
from minivllm.tracing.render import make_console, render_trace
from minivllm.tracing.trace import Trace

__all__ = ["Trace", "make_console", "render_trace"]
