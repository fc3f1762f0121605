"""Record what each stage of the engine saw, as plain JSON-ready events.

EngineTracer lives inside EngineCore (the child process by default) as an observer of the
Scheduler: right after schedule() it records the SchedulerOutput and the queues, right after
update_from_output the outputs and what was freed, and in between the step's packed batch, which
each worker recorded right after the step (tracing/steps.py, attached to the runner while the trace is
open) and hands over with `collective_rpc(take_step)`, oldest first; rank 0's is the one printed. With
async scheduling the step's output is applied after the next step was scheduled: the tracer numbers steps
as they are scheduled and matches each update to the oldest step in flight, and records when schedule()
began and each execute_model ran, and the placeholders (tracing/overlap.py prints them). Its events reach the caller
on tracing's own channel, TraceEvents messages sent ahead of the step's outputs (in-process: taken
straight from the tracer), never inside EngineCoreOutputs. Trace (tracing/trace.py) lives in the caller:
it adds "submit" and "outputs" events and holds the whole sequence. Nothing here feeds back into the engine.
"""
from __future__ import annotations

import os
import time
from collections import deque
from typing import Any

from minivllm.request import RequestStatus
from minivllm.tracing.ranks import describe_rank, set_collective_recording
from minivllm.tracing.steps import StepRecorder

_steps = StepRecorder()  # in each worker process: the steps it ran while a trace is open


def _ids(values) -> list:
    return sorted(values, key=lambda r: (len(r), r))


def describe_schedule(scheduler, so, step: int, blocks: dict[str, list[int]] | None = None) -> dict[str, Any]:
    """One SchedulerOutput plus the queues and free blocks right after schedule(), as plain data.

    Works on any Scheduler, so a scheduler driven by hand (no model) prints like the engine's.
    `blocks`: every request's block ids, if the caller already looked them up.
    """
    manager = scheduler.kv_cache_manager
    if blocks is None:
        blocks = {r: manager.get_block_ids(r) for r in so.num_scheduled_tokens}
    cached = so.scheduled_cached_reqs
    return dict(
        step=step,
        scheduled_new_reqs=[{"req_id": n.req_id, "num_prompt_tokens": len(n.prompt_token_ids),
                             "block_ids": n.block_ids, "num_computed_tokens": n.num_computed_tokens}
                            for n in so.scheduled_new_reqs],
        scheduled_cached_reqs={"req_ids": cached.req_ids, "resumed_from_preemption": cached.resumed_from_preemption,
                               "new_block_ids": cached.new_block_ids, "num_computed_tokens": cached.num_computed_tokens},
        num_scheduled_tokens=dict(so.num_scheduled_tokens), total_num_scheduled_tokens=so.total_num_scheduled_tokens,
        finished_req_ids=_ids(so.finished_req_ids), preempted_req_ids=_ids(so.preempted_req_ids),
        waiting=[r.request_id for r in scheduler.waiting], running=[r.request_id for r in scheduler.running],
        num_free_blocks=manager.block_pool.get_num_free_blocks(),
        block_tables={r: blocks[r] for r in so.num_scheduled_tokens},
        scheduled_spec_decode_tokens={r: list(d) for r, d in so.scheduled_spec_decode_tokens.items()})


def describe_batch(batch) -> dict[str, Any]:
    """A PackedBatch (the runner's flat model input for one step) as plain lists."""
    return {"req_ids": list(batch.req_ids), "num_scheduled_tokens": batch.num_scheduled_tokens.tolist(),
            "query_start_loc": batch.query_start_loc.tolist(), "seq_lens": batch.seq_lens.tolist(),
            "input_ids": batch.input_ids.tolist(), "positions": batch.positions.tolist(),
            "slot_mapping": batch.slot_mapping.tolist(), "block_table": batch.block_table.tolist(),
            "logits_indices": batch.logits_indices.tolist()}


def describe_execute(worker) -> dict[str, Any] | None:
    """Run in a worker (by collective_rpc) after a step: its runner's last packed batch and what an attention
    layer pulled from forward_context that step (the attn_metadata every layer shares, the first layer's
    kv_cache view, the slot_mapping), as plain data; None when the step ran no tokens."""
    runner = worker.model_runner
    batch, md = runner.last_batch, runner.last_attn_metadata
    if batch is None:
        return None
    layer_name, layer = next(iter(runner.attn_layers.items()))  # the first layer, as it pulled its context
    return {"batch": describe_batch(batch),
            "attention": {"layer_name": layer_name, "num_layers": len(runner.attn_layers),
                          "kv_cache_shape": list(layer.kv_cache.shape),
                          "kv_cache_dtype": str(layer.kv_cache.dtype).removeprefix("torch."),
                          "num_actual_tokens": md.num_actual_tokens, "max_query_len": md.max_query_len,
                          "max_seq_len": md.max_seq_len, "block_table_shape": list(md.block_table.shape),
                          "slot_mapping_len": int(md.slot_mapping.numel()),
                          "query_start_loc": md.query_start_loc.tolist(), "seq_lens": md.seq_lens.tolist(),
                          "block_table": md.block_table.tolist(), "slot_mapping": md.slot_mapping.tolist()}}


def describe_step(worker) -> dict[str, Any]:
    """In a worker, right after each step while a trace is open: its batch, and under TP its rank's part."""
    step = {"execute": describe_execute(worker)}
    if worker.config.tensor_parallel_size > 1:
        step["rank"] = describe_rank(worker)
    return step


def set_step_recording(worker, on: bool) -> None:
    """In each worker: attach (or detach) the step recorder, and under TP the collectives' recorder."""
    if worker.config.tensor_parallel_size > 1:
        set_collective_recording(worker, on)
    _steps.attach(worker, describe_step) if on else _steps.detach()


def take_step(worker) -> dict[str, Any] | None:
    """In each worker: the oldest step recorded and not yet taken."""
    return _steps.take()


class EngineTracer:
    """A Scheduler observer (Scheduler.observers): each hook gets the scheduler, then the call's arguments."""

    def __init__(self, model_executor, session: int | None = None, scheduler=None, steps_in_flight: int = 0) -> None:
        self.model_executor = model_executor
        self.tensor_parallel = model_executor.config.tensor_parallel_size > 1
        # the overlap is the point of async scheduling: time the stages (one in-process worker: see on_update)
        self.timed = bool(model_executor.config.async_scheduling) and hasattr(model_executor, "driver_worker")
        model_executor.collective_rpc(set_step_recording, args=(True,))
        self.scheduler, self._schedule_began, self._timed_schedule = scheduler, 0.0, None
        if scheduler is not None and self.timed:  # note when each schedule() begins, from outside
            schedule, self._replaced = scheduler.schedule, scheduler.__dict__.get("schedule")

            def timed_schedule():
                self._schedule_began = time.monotonic()
                return schedule()
            scheduler.schedule = self._timed_schedule = timed_schedule
        self._in_flight: deque[int] = deque()  # steps scheduled, their outputs not applied yet (async: two)
        self._untraced = steps_in_flight  # async: steps scheduled before the trace opened, their updates skipped
        self.session = session
        self.events: list[dict[str, Any]] = []
        self.step = 0
        self._blocks: dict[str, list[int]] = {}  # block ids per request as of the last schedule()

    def close(self) -> None:
        """Detached: the workers stop recording their steps, the scheduler runs its own schedule() again."""
        self.model_executor.collective_rpc(set_step_recording, args=(False,))
        if self._timed_schedule is not None and self.scheduler.__dict__.get("schedule") is self._timed_schedule:
            if self._replaced is None:  # what was there before: the class's method, or someone's own wrapper
                del self.scheduler.schedule
            else:
                self.scheduler.schedule = self._replaced

    def drain(self) -> list[dict[str, Any]]:
        events, self.events = self.events, []
        return events

    def _emit(self, kind: str, **fields) -> None:
        session = {} if self.session is None else {"session": self.session}
        self.events.append({"kind": kind, "process": "EngineCore", "pid": os.getpid(), **session, **fields})

    def on_add_request(self, scheduler, request) -> None:
        self._emit("arrival", request_id=request.request_id, num_prompt_tokens=len(request.prompt_token_ids),
                   waiting=[r.request_id for r in scheduler.waiting])

    def on_finish_requests(self, scheduler, request_ids, status) -> None:
        if status != RequestStatus.FINISHED_ABORTED:
            return
        freed = {r: self._blocks.pop(r, []) for r in request_ids}
        self._emit("abort", request_ids=list(request_ids), freed=freed,
                   num_free_blocks=scheduler.kv_cache_manager.block_pool.get_num_free_blocks())

    def on_schedule(self, scheduler, so) -> None:
        self.step += 1
        self._in_flight.append(self.step)
        manager = scheduler.kv_cache_manager
        self._blocks = {r: manager.get_block_ids(r) for r in scheduler.requests}
        timing = {}
        if self.timed:
            timing = {"schedule_began": self._schedule_began,
                      "placeholders": {r.request_id: r.num_output_placeholders for r in scheduler.running
                                       if r.num_output_placeholders}}
        self._emit("schedule", **describe_schedule(scheduler, so, self.step, self._blocks), **timing)

    def on_update(self, scheduler, so, model_output, outputs) -> None:
        if self._untraced:  # a step scheduled before the trace was opened
            self._untraced -= 1
            return
        step = self._in_flight.popleft()
        worker = getattr(self.model_executor, "driver_worker", None)
        # One worker in this process: read its record directly, so the trace does not wait for the step in flight
        # (a collective_rpc would: calls reach the worker in order). Ranks in other processes are asked, which
        # under async scheduling waits for it: their timings are then left out.
        records = [take_step(worker)] if worker is not None else self.model_executor.collective_rpc(take_step)
        executed = records[0] and records[0]["execute"]  # the driver rank's
        if executed is not None and self.tensor_parallel:  # what every rank held and exchanged, from each
            executed["ranks"] = [r["rank"] for r in records]
        if executed is not None:
            sampled = {r: t[0] for r, t in zip(model_output.req_ids, model_output.sampled_token_ids) if t}
            timing = {"began": records[0]["began"], "ended": records[0]["ended"]} if self.timed else {}
            self._emit("execute", step=step, **executed, sampled=sampled, **timing)
        freed = {o.request_id: self._blocks.get(o.request_id, []) for o in outputs.outputs if o.finished}
        index = model_output.req_id_to_index
        verified = {r: model_output.sampled_token_ids[index[r]] for r in so.scheduled_spec_decode_tokens}
        # speculative decoding: per request that carried drafts, the target's tokens at the draft positions plus
        # the bonus one (all that was kept) and how many drafts update_from_output rolled back
        spec_decode = {r: {"draft_token_ids": list(d), "sampled_token_ids": list(verified[r]),
                           "num_accepted": len(verified[r]) - 1, "num_rejected": len(d) + 1 - len(verified[r])}
                       for r, d in so.scheduled_spec_decode_tokens.items()}
        answered = {o.request_id for o in outputs.outputs}  # async: a finished request's later token is dropped
        dropped = {r: t for r, t in zip(model_output.req_ids, model_output.sampled_token_ids)
                   if t and r not in answered} if self.timed else {}
        self._emit("update", step=step, spec_decode=spec_decode, **({"dropped": dropped} if dropped else {}),
                   outputs=[{"request_id": o.request_id, "new_token_ids": o.new_token_ids,
                             "finish_reason": o.finish_reason, "stop_reason": o.stop_reason} for o in outputs.outputs],
                   freed=freed, num_free_blocks=scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                   waiting=[r.request_id for r in scheduler.waiting],
                   running=[r.request_id for r in scheduler.running])
