"""Mirror of vllm/utils/gc_utils.py: `freeze_gc_heap`, called once start-up is over.

Python's cyclic collector now and then walks every object it tracks (a generation-2 collection). An engine
that has just started holds many of them for good: the model's modules and parameters, the CPU graphs' recorded
calls and their ctypes arguments, the tokenizer. Each full collection then walks all of them, and one that
falls inside a decode step of the first real batch makes the user's first batch slower than the second.
`gc.freeze()` moves everything alive at that moment into a generation the collector never walks again; what the
engine allocates later is collected as before.
vLLM calls it at the end of EngineCore's start-up, after its workers' warm-up, and in the API server's lifespan,
and undoes it (`gc.unfreeze`) when EngineCore shuts down, so that an engine built and dropped in one process
(a test, a notebook) can still be collected: minivllm calls it in the same places, and unfreezes again when its
API server's lifespan ends (a server run in a thread; vLLM's server process simply exits).

`gc_paused` is minivllm's own (vLLM has none): start-up builds objects that nearly all live on, and while
the heap grows the collector keeps walking all of it (SmolLM2's EngineCore child made several full passes while
transformers imported, before the model was loaded). LLMEngine and the EngineCore child build with the
collector off, and freeze_gc_heap's collection at the end of start-up finds whatever cycles it left.
"""
from __future__ import annotations

import contextlib
import gc


def freeze_gc_heap() -> None:
    """Collect whatever is already garbage (all generations), then freeze every object still alive."""
    gc.collect()
    gc.freeze()


@contextlib.contextmanager
def gc_paused():
    """No automatic collection inside (start-up); the collector's state is restored on the way out."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
