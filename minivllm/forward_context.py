"""Mirror of vllm/forward_context.py: step metadata reaches attention layers without a signature change.

`set_forward_context` installs one step's attention metadata, slot_mapping and
the layer registry for the duration of the model forward; an Attention layer
pulls them back by its `layer_name`. Model forwards keep `(input_ids,
positions)` only. Left out: data-parallel metadata, batch descriptors, CUDA
graph runtime modes, ubatching.
`additional_kwargs` is vLLM's field for whatever else a model's forward may read; nothing
in minivllm sets it.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator


@dataclass
class ForwardContext:
    no_compile_layers: dict[str, Any]  # layer_name -> Attention
    attn_metadata: Any  # one metadata object shared by every layer (a single KV-cache group)
    slot_mapping: dict[str, Any]  # layer_name -> [num_tokens] slot per token
    additional_kwargs: dict[str, Any] = field(default_factory=dict)


_forward_context: ForwardContext | None = None


def get_forward_context() -> ForwardContext:
    if _forward_context is None:
        raise RuntimeError("No forward context is set: attention layers only run inside "
                           "set_forward_context(...), as the model runner does in execute_model().")
    return _forward_context


@contextmanager
def set_forward_context(attn_metadata: Any, no_compile_layers: dict[str, Any],
                        slot_mapping: Any = None, additional_kwargs: dict | None = None) -> Iterator[None]:
    """Install the context for one forward and restore the previous one afterwards."""
    global _forward_context
    if slot_mapping is not None and not isinstance(slot_mapping, dict):
        slot_mapping = {name: slot_mapping for name in no_compile_layers}
    previous = _forward_context
    _forward_context = ForwardContext(no_compile_layers, attn_metadata, slot_mapping or {}, additional_kwargs or {})
    try:
        yield
    finally:
        _forward_context = previous
