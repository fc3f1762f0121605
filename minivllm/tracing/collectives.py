"""Recording a rank's tensor-parallel collectives for the trace, attached from outside the layers.

While a trace is open, `CollectiveRecorder.attach` wraps this process's tensor-parallel GroupCoordinator: its
all_reduce / all_gather / gather are replaced, on that one object, by versions that call the real one and note
what went in and came out (shapes and a few numbers). Forward hooks on the layers that end in a collective
(RowParallelLinear, VocabParallelEmbedding, LogitsProcessor) then name the layer whose collective was noted last.
`detach` puts everything back: with no trace open, the model and the group run exactly their own code, and
neither minivllm/distributed nor minivllm/models knows tracing exists.
"""
from __future__ import annotations

from typing import Any

import torch

_OPS = ("all_reduce", "all_gather", "gather")


class CollectiveRecorder:
    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self._group = None
        self._hooks: list = []

    def attach(self, group, model: torch.nn.Module) -> None:
        from minivllm.models.linear import RowParallelLinear
        from minivllm.models.logits_processor import LogitsProcessor
        from minivllm.models.vocab_parallel_embedding import VocabParallelEmbedding
        self.detach()
        self._group, self.records = group, []
        for op in _OPS:
            setattr(group, op, self._recording(op, getattr(group, op)))
        for module in model.modules():
            if isinstance(module, RowParallelLinear) or type(module) is VocabParallelEmbedding:
                self._hooks.append(module.register_forward_hook(self._label_hook(module.prefix)))
            elif isinstance(module, LogitsProcessor):  # its forward(lm_head, hidden_states) gathers lm_head's logits
                self._hooks.append(module.register_forward_hook(lambda m, args, out: self._label(args[0].prefix)))

    def detach(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._group is not None:
            for op in _OPS:
                self._group.__dict__.pop(op, None)  # the class's method shows through again
            self._group = None

    def take(self) -> list[dict[str, Any]]:
        records, self.records = self.records, []
        return records

    def _recording(self, op: str, real):
        def recorded(input_: torch.Tensor, *args, **kwargs):
            before = input_.clone() if op == "all_reduce" else input_  # all_reduce sums in place
            output = real(input_, *args, **kwargs)
            entry = {"op": op, "shape": list(before.shape), "input": before.flatten()[:4].tolist()}
            if output is not None:
                entry.update(output_shape=list(output.shape), output=output.flatten()[:4].tolist())
            self.records.append(entry)
            return output
        return recorded

    def _label_hook(self, name: str):
        return lambda module, args, output: self._label(name)

    def _label(self, name: str) -> None:
        if self.records:
            self.records[-1].setdefault("layer", name)
