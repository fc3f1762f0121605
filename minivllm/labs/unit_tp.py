"""Unit checks of lab 14 (the row-parallel linear layer), without an engine and without processes: tp_size ranks
simulated by threads in this process, each with its own RowParallelLinear, joined by an all-reduce that sums
their tensors in rank order (a barrier with a time bound: a rank that never calls it fails, never hangs).

Cases at tp_size 1, 2 and 4, odd output sizes, with and without a bias, and reduce_results off. The weight loaded
by the submission's weight_loader, the bias its local_bias gives, and what its forward returns on every rank are
compared with the engine's own functions on the same case.
"""
from __future__ import annotations

import contextlib
import threading
from unittest import mock

import torch

from minivllm.distributed import communication_op, parallel_state
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.models import linear
from minivllm.models.linear import RowParallelLinear

# (label, tp_size, input_size, output_size, bias, tokens, reduce_results)
CASES = [("a square weight, tp 2, a bias", 2, 8, 8, True, 3, True), ("tp 4, a bias", 4, 16, 6, True, 5, True),
         ("tp 2, no bias", 2, 12, 5, False, 2, True), ("tp 1, a bias", 1, 6, 3, True, 2, True),
         ("tp 2, reduce_results=False (the caller sums)", 2, 8, 4, True, 2, False)]
_LOCAL, _MISSING = threading.local(), object()


class _Group:
    """One simulated rank of a tp group: rank_in_group, world_size, an all-reduce over the threads."""

    def __init__(self, rank: int, size: int, shared: dict) -> None:
        self.rank_in_group, self.world_size, self.shared, self.is_first_rank = rank, size, shared, rank == 0
        self.calls: list = []  # the collectives this rank performed, in order: [name, shape]

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        self.calls.append(["all_reduce", list(tensor.shape)])
        if self.world_size == 1:
            return tensor
        parts, barrier = self.shared["parts"], self.shared["barrier"]
        parts[self.rank_in_group] = tensor.clone()
        barrier.wait()
        total = sum(parts[r] for r in range(self.world_size))
        barrier.wait()
        tensor.copy_(total)
        return tensor


def _group():
    return getattr(_LOCAL, "group", None) or parallel_state._SINGLE


class _ThisThreadsGroup:
    """parallel_state._TP while simulating: every attribute is the calling rank's (thread's) group's, so a
    get_tp_group a submission imported by name (from parallel_state import get_tp_group) reaches it too."""

    def __getattr__(self, name: str):
        return getattr(_group(), name)


@contextlib.contextmanager
def _simulated():
    with mock.patch.object(parallel_state, "_TP", _ThisThreadsGroup()), \
            mock.patch.object(parallel_state, "get_tp_group", _group), \
            mock.patch.object(communication_op, "get_tp_group", _group), \
            mock.patch.object(linear, "get_tp_group", _group):
        yield


def _full(case):
    _, tp, n_in, n_out, bias, tokens, _ = case
    g = torch.Generator().manual_seed(n_in * 31 + n_out)
    return (torch.randn(n_out, n_in, generator=g), torch.randn(n_out, generator=g) if bias else None,
            torch.randn(tokens, n_in, generator=g))


def _ranks(case, body) -> list:
    """Run body(layer, rank) on every simulated rank of `case`, in threads; one result (or error text) each."""
    _, tp, n_in, n_out, bias, _, reduce_results = case
    shared, results = {"parts": [None] * tp, "barrier": threading.Barrier(tp, timeout=3)}, [_MISSING] * tp

    def rank_thread(rank):
        _LOCAL.group = _Group(rank, tp, shared)
        try:
            layer = RowParallelLinear(n_in, n_out, bias=bias, prefix="layers.0.o_proj", reduce_results=reduce_results)
            results[rank] = body(layer, rank)
        except threading.BrokenBarrierError:
            results[rank] = "error: the all-reduce waited 3 s for a rank that never called it"
        except Exception as e:  # noqa: BLE001 - the submission's error, reported with the case
            results[rank] = e if isinstance(e, NotImplementedError) else f"error: {type(e).__name__}: {str(e)[:120]}"
            shared["barrier"].abort()
        finally:
            _LOCAL.group = None
    with _simulated():
        threads = [threading.Thread(target=rank_thread, args=(r,), daemon=True) for r in range(tp)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=10)
    stub = next((r for r in results if isinstance(r, NotImplementedError)), None)
    if stub is not None:
        raise stub  # an untouched stub: the grader names the function to write
    return [r if r is not _MISSING else "error: did not return within 10 s" for r in results]


def _values(t) -> list | str:
    return [round(v, 4) for v in t.flatten().tolist()] if isinstance(t, torch.Tensor) else repr(t)[:60]


@unit
def lab14_loader_observe(sub, llm, obs):
    obs["loaded"] = []
    for case in CASES:
        weight, bias, _ = _full(case)

        def load(layer, rank):
            sub["weight_loader"](layer, layer.weight, weight)
            if bias is not None:
                sub["weight_loader"](layer, layer.bias, bias)
            return [_values(layer.weight.data), _values(layer.bias.data) if bias is not None else None]
        obs["loaded"].append(_ranks(case, load))


@unit
def lab14_bias_observe(sub, llm, obs):
    obs["bias"] = []
    for case in CASES:
        _, bias, _ = _full(case)

        def local(layer, rank):
            if bias is not None:
                layer.bias.data.copy_(bias)
            got = sub["local_bias"](layer)
            return None if got is None else _values(got)
        obs["bias"].append(_ranks(case, local))


@unit
def lab14_forward_observe(sub, llm, obs):
    """Each rank's output, and ("collectives") the all-reduces it performed, per case."""
    obs["outputs"], obs["collectives"] = [], []
    for case in CASES:
        weight, bias, x = _full(case)
        size = case[2] // case[1]

        def run(layer, rank):
            layer.weight.data.copy_(weight[:, rank * size:(rank + 1) * size])
            if bias is not None:
                layer.bias.data.copy_(bias)
            got = sub["forward"](layer, x[:, rank * size:(rank + 1) * size].clone())
            ok = isinstance(got, tuple) and len(got) == 2 and isinstance(got[0], torch.Tensor)
            return [_values(got[0]) if ok else f"not (tensor, None): {repr(got)[:50]}", _LOCAL.group.calls]
        per_rank = [r if isinstance(r, list) else [r, None] for r in _ranks(case, run)]
        obs["outputs"].append([r[0] for r in per_rank])
        obs["collectives"].append([r[1] for r in per_rank])


def lab14_collectives_judge(obs, ref):
    """Each rank performs the reference's collectives, no more, no fewer: one all-reduce of the whole output."""
    for case, exp, got in zip(CASES, ref["collectives"], obs["collectives"]):
        for rank, (e, g) in enumerate(zip(exp, got)):
            if e != g:
                raise LabCheckFailed("forward: the collectives each rank performs", f"{case[0]}: rank {rank}, its "
                                     "collectives in order ([name, shape])", e, g,
                                     "one tensor_model_parallel_all_reduce of the whole [num_tokens, output_size] "
                                     "partial sum; none at tp_size 1 or "
                                     "with reduce_results=False: every extra collective is a wait for all ranks")


def _judge(check: str, key: str, what: str, hint):
    def judge(obs, ref):
        for case, exp, got in zip(CASES, ref[key], obs[key]):
            for rank, (e, g) in enumerate(zip(exp, got)):
                close = isinstance(g, type(e)) and (e == g or _close(e, g))
                if not close:
                    where = f"{case[0]} (input {case[2]}, output {case[3]}): rank {rank}, {what}"
                    raise LabCheckFailed(check, where, _short(e), _short(g), hint(case, rank, g))
    return judge


def _close(e, g) -> bool:
    flat = lambda v: [x for part in v for x in (part if isinstance(part, list) else [part])]  # noqa: E731
    try:
        a, b = flat(e), flat(g)
        return len(a) == len(b) and all(abs(x - y) <= 1e-3 * (1 + abs(x)) for x, y in zip(a, b))
    except TypeError:
        return False


def _short(v):
    return v if not isinstance(v, list) else str(v)[:90]


def _loader_hint(case, rank, got):
    return ("the rank's slice is along the input dimension (dim 1): columns tp_rank * n / tp_size to (tp_rank + 1) "
            "* n / tp_size; the bias whole on every rank")


def _bias_hint(case, rank, got):
    return "the partial sums are added up: only rank 0 adds the bias, so it counts once (None on the other ranks)"


def _forward_hint(case, rank, got):
    if isinstance(got, str) and got.startswith("error: the all-reduce"):
        return "every rank calls the all-reduce, with its own partial output"
    return ("self.matmul(x) first (this rank's partial sum), then tensor_model_parallel_all_reduce of that output "
            "(not of the input); skip the sum when reduce_results is False or tp_size is 1")


lab14_loader_judge = _judge("weight_loader: each rank its columns", "loaded", "weight and bias loaded", _loader_hint)
lab14_bias_judge = _judge("local_bias: the bias once", "bias", "local_bias()", _bias_hint)
lab14_forward_judge = _judge("forward: partial sums, all-reduced", "outputs", "forward output", _forward_hint)
