"""How minivllm/compilation/cpu_graph.py records a forward's C calls and makes one template of two recordings.

No vLLM counterpart: a CUDA graph is recorded by the driver. Here a forward is recorded twice: a stand-in for _C's
library writes down each C call without running it (`Recording`) while a TorchDispatchMode (`Watch`) keeps every
tensor the forward allocates and refuses, at once, any torch op that computes. Not running the calls is what makes
a capture cheap (no arithmetic at the largest batch), and it is safe for the same reason a replay is: in a forward
the Watch accepts, only C calls read what C calls write; Python reading a value would be a torch op (`.item()`, a
comparison), which stops the recording before it sees the unwritten bytes. `derive_template` then checks the two
recordings against each other (the same calls; arguments equal, or differing exactly as the two row counts;
allocations growing with the rows), turns every pointer into a forward-made tensor into an offset in one arena
(`place`: tensors whose lifetimes do not meet share bytes) and refuses any other pointer that is not into memory
kept between steps.
"""
from __future__ import annotations

import bisect
import ctypes
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from minivllm import _C

ALIGN = 64  # bytes: every arena slot starts on a cache line
_ALLOCATING = {"aten.empty.memory_format", "aten.empty_like.default"}
# Ops that only make views or aliases (a `.to()` or `.contiguous()` that changes nothing lands here too;
# one that copies shows up as another op and refuses the capture).
_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.split_with_sizes.default", "aten.split.Tensor",
          "aten.select.int", "aten.slice.Tensor", "aten.detach.default", "aten.alias.default", "aten.to.dtype",
          "aten.contiguous.default", "aten.reshape.default", "aten.unbind.int", "aten.chunk.default"}


class CaptureRefused(Exception):
    """The forward cannot be replayed from its C calls alone; the message says why."""


class Watch(TorchDispatchMode):
    """Sees every torch op of the captured forward: keeps what it allocates, refuses what computes."""

    def __init__(self) -> None:
        super().__init__()
        self.allocs: list[torch.Tensor] = []
        self.refused: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func)
        if name not in _ALLOCATING and name not in _VIEWS:
            self._refuse(f"the forward runs {name}, which a replay of C calls would skip")
        out = func(*args, **(kwargs or {}))
        if name in _ALLOCATING:
            self.allocs.append(out)
        elif name in ("aten.to.dtype", "aten.contiguous.default") and out.data_ptr() != args[0].data_ptr():
            self._refuse(f"the forward copies a tensor ({name})")
        return out

    def _refuse(self, why: str):
        """Stop the recorded forward here: the C calls before this op did not run, so nothing may go on to read
        their outputs."""
        self.refused = why
        raise CaptureRefused(why)


class Recording:
    """Stands in for _C._lib while capturing: writes down each C call as (name, args) and does not run it (the
    forward's C functions return nothing; see the module docstring for why skipping them is safe)."""

    def __init__(self, lib) -> None:
        self._lib, self.calls = lib, []

    def __getattr__(self, name):
        if name not in _C.SIGNATURES or _C.SIGNATURES[name][1] is not None:
            return getattr(self._lib, name)  # one that answers something (panel_width): the library's own

        def call(*args):
            self.calls.append((name, args))
        return call


class At(int):
    """A recorded pointer argument that is a byte offset into the arena."""


ROWS = object()  # a recorded argument that is the batch's row count


@dataclass
class Trace:
    """One recorded forward: its C calls, what it allocated (in order), its output."""
    calls: list[tuple[str, tuple]]
    allocs: list[torch.Tensor]
    output: torch.Tensor


@dataclass
class Template:
    """The forward for any batch size up to max_batch_size: C calls whose arguments are constants, ROWS or At."""
    calls: list[tuple[str, tuple]]
    output: tuple[int, int, torch.dtype]  # arena offset, hidden size, dtype of the result [rows, hidden]
    arena_bytes: int
    sizes: range  # the batch sizes it serves


def regions(tensors) -> tuple[list[int], list[int], list[int]]:
    """(starts, ends, index in `tensors`) of the storages behind `tensors`, sorted by start, for _find."""
    storages = [t.untyped_storage() for t in tensors]
    spans = sorted((s.data_ptr(), s.data_ptr() + s.nbytes(), i) for i, s in enumerate(storages) if s.nbytes())
    return [s for s, _, _ in spans], [e for _, e, _ in spans], [i for _, _, i in spans]


def _find(regions, ptr: int) -> tuple[int, int]:
    """(index of the tensor whose storage holds `ptr`, offset of `ptr` in it), or (-1, 0)."""
    starts, ends, index = regions
    i = bisect.bisect_right(starts, ptr) - 1
    return (index[i], ptr - starts[i]) if i >= 0 and ptr < ends[i] else (-1, 0)


def place(lifetimes: list[tuple[int, int, int]]) -> tuple[list[int], int]:
    """Offsets for buffers given as (nbytes, first use, last use): two share bytes only where their uses do
    not meet (closed intervals). First fit, biggest first. Returns (offset per buffer, arena bytes)."""
    offsets, placed = [0] * len(lifetimes), []  # placed: (offset, end, first, last)
    for i in sorted(range(len(lifetimes)), key=lambda i: -lifetimes[i][0]):
        size, first, last = lifetimes[i]
        size = -(-size // ALIGN) * ALIGN
        busy = sorted((o, e) for o, e, f, l in placed if not (l < first or last < f))
        offset = 0
        for o, e in busy:
            if offset + size <= o:
                break
            offset = max(offset, e)
        offsets[i] = offset
        placed.append((offset, offset + size, first, last))
    return offsets, max((e for _, e, _, _ in placed), default=0)


def tensors_kept(model: torch.nn.Module, extra) -> list[torch.Tensor]:
    """Every tensor that outlives a step: the model's parameters, buffers and tensor attributes (packed
    weights, the KV caches bound to its Attention layers), and `extra`."""
    found = list(extra)
    for m in model.modules():
        found += [t for t in (*m._parameters.values(), *m._buffers.values(), *vars(m).values())
                  if isinstance(t, torch.Tensor) and t.layout == torch.strided]
    return found


def _relocate(trace: Trace, kept) -> tuple[list, dict, tuple[int, int]]:
    """The trace's calls with each pointer into one of its allocations as (allocation, offset); any other
    pointer must be into kept memory. Also: allocation -> [first, last call using it], and the output's place."""
    allocs, calls, uses = regions(trace.allocs), [], {}
    for i, (name, args) in enumerate(trace.calls):
        new = []
        for kind, value in zip(_C.SIGNATURES[name][0], args):
            if kind is ctypes.c_void_p and value is not None:
                a, offset = _find(allocs, value)
                if a >= 0:
                    uses.setdefault(a, [i, i])[1] = i
                    value = (a, offset)
                elif _find(kept, value)[0] < 0:
                    raise CaptureRefused(f"{name} is handed a pointer into memory not kept between steps")
            new.append(value)
        calls.append((name, new))
    out = trace.output
    a, offset = _find(allocs, out.data_ptr())
    if a < 0 or not out.is_contiguous() or out.dim() != 2:
        raise CaptureRefused("the forward's output is not a [num_tokens, hidden] buffer of its own")
    uses.setdefault(a, [len(calls), len(calls)])[1] = len(calls)
    return calls, uses, (a, offset)


def derive_template(traces: list[Trace], sizes: tuple[int, ...], kept) -> Template:
    """One template from forwards recorded at `sizes`: the largest, then two rows (serving every size up to the
    largest), or the largest alone (serving that size only). Where the two recordings differ, they must differ
    exactly as their row counts, and every allocation must grow with them."""
    (calls, uses, (out, out_offset)), *others = [_relocate(t, kept) for t in traces]
    nbytes = [t.untyped_storage().nbytes() for t in traces[0].allocs]
    for (other_calls, _, other_out), trace in zip(others, traces[1:]):
        other_nbytes = [t.untyped_storage().nbytes() for t in trace.allocs]
        if [n for n, _ in calls] != [n for n, _ in other_calls] or len(nbytes) != len(other_nbytes) \
                or (out, out_offset) != other_out:
            raise CaptureRefused(f"the forward at {sizes[1]} rows makes other calls than at {sizes[0]}")
        if any(a * sizes[1] != b * sizes[0] for a, b in zip(nbytes, other_nbytes)):
            raise CaptureRefused("an allocation of the forward does not grow with its rows")
        for (name, args), (_, other_args) in zip(calls, other_calls):
            for j, (x, y) in enumerate(zip(args, other_args)):
                if x != y:
                    if (x, y) != sizes:
                        raise CaptureRefused(f"argument {j} of {name} changes with the rows, not as them")
                    args[j] = ROWS
    live = sorted(uses)
    offsets, arena_bytes = place([(nbytes[a], *uses[a]) for a in live])
    slot = dict(zip(live, offsets))
    calls = [(name, tuple(At(slot[v[0]] + v[1]) if type(v) is tuple else v for v in args)) for name, args in calls]
    hidden = traces[0].output.shape[1]
    return Template(calls, (slot[out] + out_offset, hidden, traces[0].output.dtype), arena_bytes,
                     range(1, sizes[0] + 1) if others else range(sizes[0], sizes[0] + 1))
