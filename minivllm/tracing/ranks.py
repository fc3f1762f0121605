"""Tracing under tensor parallelism: what each rank holds and exchanges, reported by the rank itself.

`describe_rank` and `set_collective_recording` run inside the worker processes (EngineTracer calls them by
`collective_rpc`, so they are module-level functions: a call is pickled by reference; with TP=1 it makes no
such call at all); `rank_lines` turns their answers into the lines `make trace` prints for one step.
`time_all_reduce` times one all-reduce on each rank, through shared memory and through gloo (notebook 08).
"""
from __future__ import annotations

import os
from typing import Any

from minivllm.tracing.collectives import CollectiveRecorder
from minivllm.tracing.text import atom

_recorder = CollectiveRecorder()  # this worker process's: attached while a trace is open


def set_collective_recording(worker, on: bool) -> None:
    """In each worker: record (or stop recording) the tensor-parallel group's collectives."""
    from minivllm.distributed.parallel_state import get_tp_group
    if on:
        _recorder.attach(get_tp_group(), worker.model_runner.get_model())
    else:
        _recorder.detach()


def describe_rank(worker) -> dict[str, Any]:
    """In each worker: which shard this rank holds, and the collectives it took part in since the last call
    (recorded while tracing is on), which are then cleared."""
    from minivllm.distributed.parallel_state import get_tp_group
    from minivllm.models.linear import ColumnParallelLinear, QKVParallelLinear
    from minivllm.models.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    tp, runner = get_tp_group(), worker.model_runner
    modules = list(runner.get_model().named_modules())
    qkv = next(m for _, m in modules if isinstance(m, QKVParallelLinear))
    mlp_name, mlp = next((n, m) for n, m in modules if type(m) is not QKVParallelLinear
                         and isinstance(m, ColumnParallelLinear))  # gate_up_proj (Llama) or fc1 (OPT)
    embed = next(m for _, m in modules if type(m) is VocabParallelEmbedding)
    lm_head = next(m for _, m in modules if isinstance(m, ParallelLMHead))
    r, kv_first = tp.rank_in_group, (tp.rank_in_group // qkv.num_kv_head_replicas) * qkv.num_kv_heads
    units = mlp.output_sizes[0] // tp.world_size  # this rank's slice of each fused part
    records = _recorder.take()
    reduces = [e for e in records if e["op"] == "all_reduce"]
    return {"rank": r, "tp_size": tp.world_size, "pid": os.getpid(),
            "query_heads": [r * qkv.num_heads, (r + 1) * qkv.num_heads], "total_num_heads": qkv.total_num_heads,
            "kv_heads": [kv_first, kv_first + qkv.num_kv_heads], "total_num_kv_heads": qkv.total_num_kv_heads,
            "qkv_proj_shape": [qkv.output_size_per_partition, qkv.input_size_per_partition],
            "mlp": {"layer": mlp_name, "shape": [mlp.output_size_per_partition, mlp.input_size_per_partition],
                    "units": [r * units, (r + 1) * units], "total_units": mlp.output_sizes[0]},
            "vocab": [embed.vocab_start_index, embed.vocab_end_index], "vocab_size": embed.org_vocab_size,
            "lm_head_shape": [lm_head.num_embeddings_per_partition, lm_head.embedding_dim],
            "kv_cache_shape": list(runner.kv_caches[0].shape),
            "num_all_reduce": len(reduces), "all_reduce": reduces[:3],  # the embedding's, then layer 0's two
            "all_gather": [e for e in records if e["op"] == "all_gather"][-1:]}  # the sampled rows' logits


def time_all_reduce(worker, numel: int = 576, iters: int = 200) -> dict[str, float]:
    """In each worker: microseconds per all-reduce of `numel` float32 values (by default one decode row of
    SmolLM2's hidden size), `iters` in a row, through the group's shared-memory communicator (the engine's path
    when the ranks share a machine) and through torch.distributed's gloo group (the path without it)."""
    import time

    import torch

    from minivllm.distributed.parallel_state import get_tp_group
    tp, x = get_tp_group(), torch.zeros(numel)  # zeros: summed in place 200 times, they stay finite
    # gloo through its process group object: what torch.distributed.all_reduce runs, without the Python wrapper
    paths = {"gloo": lambda: tp.device_group.allreduce([x]).wait()}
    if tp.device_communicator is not None:
        paths["shared memory"] = lambda: tp.device_communicator.all_reduce(x)
    times = {}
    for name, reduce in paths.items():
        reduce()  # the first call's one-time costs
        tp.cpu_group.barrier().wait()  # every rank starts the timed loop together
        start = time.perf_counter()
        for _ in range(iters):
            reduce()
        times[name] = 1e6 * (time.perf_counter() - start) / iters
    return times


def _span(bounds: list[int]) -> str:
    """[start, end) as "start-(end-1)", or one number."""
    return str(bounds[0]) if bounds[1] - bounds[0] == 1 else f"{bounds[0]}-{bounds[1] - 1}"


def _numbers(values: list) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + ", ...]"


def rank_lines(ranks: list[dict]) -> list[tuple[str, str]]:
    """One step under tensor parallelism, as (head, body) lines for render.put: each rank's shard, then the
    first all-reduces by their numbers (every rank's partial input, the sum all of them hold) and the gather."""
    lines = [("tensor parallel: ", f"{len(ranks)} ranks, one worker process each. Rank 0 received this "
              "SchedulerOutput from the executor and broadcast it; every rank packed the same batch above and "
              "ran its shard:")]
    for r in ranks:
        q, kv, mlp = r["query_heads"], r["kv_heads"], r["mlp"]
        lines.append((f"  rank {r['rank']} (pid={r['pid']}): ",
                      f"query heads {_span(q)} of {r['total_num_heads']}, KV heads {_span(kv)} of "
                      f"{r['total_num_kv_heads']} (qkv_proj {atom(str(r['qkv_proj_shape']))}); {mlp['layer']} "
                      f"{atom(str(mlp['shape']))}: units {_span(mlp['units'])} of {mlp['total_units']}; vocab ids "
                      f"{_span(r['vocab'])} (lm_head {atom(str(r['lm_head_shape']))}); kv_cache "
                      f"{atom(str(r['kv_cache_shape']))}"))
    first = ranks[0]
    for i, reduce in enumerate(first["all_reduce"]):
        inputs = "; ".join(f"rank {r['rank']} in {_numbers(r['all_reduce'][i]['input'])}" for r in ranks)
        lines.append((f"  all-reduce {reduce.get('layer', i)} {atom(str(reduce['shape']))}: ",
                      f"{inputs} -> every rank {_numbers(reduce['output'])}"))
    for g in first["all_gather"]:
        lines.append((f"  all-gather {g.get('layer', '')}: ",
                      f"each rank's logits {atom(str(g['shape']))} -> {atom(str(g['output_shape']))} on every "
                      f"rank, which all sample the same tokens"))
    lines.append(("  ", f"{first['num_all_reduce']} all-reduces this step on every rank (the embedding, then 2 per "
                        f"layer)"))
    return lines
