"""Tracing: watch one request travel the article's path, from the engine's real state.

`tracer.py` records (EngineTracer, a Scheduler observer inside EngineCore, plus
`describe_execute`, run in each worker; steps.py and collectives.py, attached to a
worker while a trace is open); `trace.py` holds Trace in the caller and `run_traced`;
`render.py` and the viewer print it. Tracing observes and never changes what the engine
does: the same tokens come out with it on or off. It sits below the engine and the
entrypoints and imports neither: the applications built on it live with them
(`python -m minivllm trace` and `trace-serve` in entrypoints/cli/, the server's live
page in entrypoints/openai/trace_page.py).
"""
from minivllm.tracing.render import make_console, render_trace
from minivllm.tracing.trace import Trace, run_traced

__all__ = ["Trace", "make_console", "render_trace", "run_traced"]
