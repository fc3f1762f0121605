"""Record what each stage of the engine saw, as plain JSON-ready events.

EngineTracer lives inside EngineCore (the child process by default) as an observer of the
Scheduler: right after schedule() it records the SchedulerOutput and the queues, right after
update_from_output the outputs and what was freed, and in between the step's packed batch, which
it reads after the fact from every worker (`collective_rpc(describe_execute)`: each rank answers
from its runner's `last_batch`; rank 0's answer is the one printed). Its events reach the caller
on tracing's own channel, TraceEvents messages sent ahead of the step's outputs (in-process: taken
straight from the tracer), never inside EngineCoreOutputs. Trace lives in the caller: it adds
"submit" and "outputs" events and holds the whole sequence. Nothing here feeds back into the engine.
"""
from __future__ import annotations

import json
import os
import weakref
from pathlib import Path
from typing import Any, Callable

from minivllm.request import RequestStatus
from minivllm.tracing.ranks import describe_rank, record_collectives


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
        block_tables={r: blocks[r] for r in so.num_scheduled_tokens})


def describe_batch(batch) -> dict[str, Any]:
    """A PackedBatch (the runner's flat model input for one step) as plain lists."""
    return {"req_ids": list(batch.req_ids), "num_scheduled_tokens": batch.num_scheduled_tokens.tolist(),
            "query_start_loc": batch.query_start_loc.tolist(), "seq_lens": batch.seq_lens.tolist(),
            "input_ids": batch.input_ids.tolist(), "positions": batch.positions.tolist(),
            "slot_mapping": batch.slot_mapping.tolist(), "block_table": batch.block_table.tolist(),
            "logits_indices": batch.logits_indices.tolist()}


def describe_execute(worker) -> dict[str, Any] | None:
    """Run in a worker (by collective_rpc) after a step: its runner's last packed batch and the attention
    metadata every layer pulled that step, as plain data; None when the step ran no tokens."""
    runner = worker.model_runner
    batch, md = runner.last_batch, runner.last_attn_metadata
    if batch is None:
        return None
    layer_name, layer = next(iter(runner.attn_layers.items()))  # the first layer, as it pulled its context
    return {"batch": describe_batch(batch),
            "attention": {"layer_name": layer_name, "kv_cache_shape": list(layer.kv_cache.shape),
                          "num_actual_tokens": md.num_actual_tokens, "max_query_len": md.max_query_len,
                          "max_seq_len": md.max_seq_len, "block_table_shape": list(md.block_table.shape),
                          "slot_mapping_len": int(md.slot_mapping.numel())}}


class EngineTracer:
    """A Scheduler observer (Scheduler.observers): each hook gets the scheduler, then the call's arguments."""

    def __init__(self, model_executor, session: int | None = None) -> None:
        self.model_executor = model_executor
        self.tensor_parallel = model_executor.config.tensor_parallel_size > 1
        record_collectives(model_executor, True)
        self.session = session
        self.events: list[dict[str, Any]] = []
        self.step = 0
        self._blocks: dict[str, list[int]] = {}  # block ids per request as of the last schedule()

    def close(self) -> None:
        """Detached: the ranks stop recording their collectives."""
        record_collectives(self.model_executor, False)

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
        manager = scheduler.kv_cache_manager
        self._blocks = {r: manager.get_block_ids(r) for r in scheduler.requests}
        self._emit("schedule", **describe_schedule(scheduler, so, self.step, self._blocks))

    def on_update(self, scheduler, so, model_output, outputs) -> None:
        executed = self.model_executor.collective_rpc(describe_execute)[0]  # the driver rank's
        if executed is not None and self.tensor_parallel:  # what every rank held and exchanged, from each
            executed["ranks"] = self.model_executor.collective_rpc(describe_rank)
        if executed is not None:
            sampled = {r: t[0] for r, t in zip(model_output.req_ids, model_output.sampled_token_ids) if t}
            self._emit("execute", step=self.step, **executed, sampled=sampled)
        freed = {o.request_id: self._blocks.get(o.request_id, []) for o in outputs.outputs if o.finished}
        self._emit("update", step=self.step,
                   outputs=[{"request_id": o.request_id, "new_token_ids": o.new_token_ids,
                             "finish_reason": o.finish_reason, "stop_reason": o.stop_reason} for o in outputs.outputs],
                   freed=freed, num_free_blocks=scheduler.kv_cache_manager.block_pool.get_num_free_blocks(),
                   waiting=[r.request_id for r in scheduler.waiting],
                   running=[r.request_id for r in scheduler.running])


class Trace:
    """The caller's record: engine facts (info) plus every event from both processes, in order."""

    def __init__(self, info: dict, events: list | None = None, caller_pid: int | None = None,
                 source: Callable[[], list] | None = None) -> None:
        self.info = dict(info)
        self.caller_pid = os.getpid() if caller_pid is None else caller_pid
        self.events: list[dict[str, Any]] = list(events or [])
        # the engine client's take_trace_events (EngineCore's events so far, in order), held weakly: a kept
        # Trace must not keep a finished engine, its weights and its KV cache, alive
        self.source = weakref.WeakMethod(source) if source is not None else None

    @property
    def multiprocess(self) -> bool:
        return self.info.get("pid") != self.caller_pid

    def extend(self, events: list[dict[str, Any]]) -> None:
        self.events.extend(events)

    def on_submit(self, request, text: str | None) -> None:
        self.events.append({"kind": "submit", "process": "caller", "pid": self.caller_pid,
                            "request_id": request.request_id, "prompt": text,
                            "prompt_token_ids": list(request.prompt_token_ids),
                            "max_tokens": request.sampling_params.max_tokens})

    def on_outputs(self, engine_core_outputs, processed) -> None:
        """After the caller processed one step's outputs: first EngineCore's events up to that step."""
        take = self.source() if self.source is not None else None
        if take is not None:
            self.extend(take())
        if processed.request_outputs:
            self.events.append({"kind": "outputs", "process": "caller", "pid": self.caller_pid,
                                "outputs": [{"request_id": o.request_id, "text": o.outputs[0].text,
                                             "token_ids": o.outputs[0].token_ids, "finished": o.finished,
                                             "finish_reason": o.outputs[0].finish_reason,
                                             "stop_reason": o.outputs[0].stop_reason}
                                            for o in processed.request_outputs],
                                "reqs_to_abort": list(processed.reqs_to_abort)})

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == kind]

    # Read-only views over the recorded events (the figures and tests ask these questions).
    def by_step(self) -> dict[int, dict[str, dict]]:
        """{step: {"schedule": ..., "execute": ..., "update": ...}} for every step the engine ran."""
        out: dict[int, dict[str, dict]] = {}
        for e in self.events:
            if "step" in e:
                out.setdefault(e["step"], {})[e["kind"]] = e
        return out

    def num_prompt_tokens(self) -> dict[str, int]:
        """{request_id: prompt length}, in arrival order."""
        return {e["request_id"]: e["num_prompt_tokens"] for e in self.of_kind("arrival")}

    def preempted_at(self, request_id: str) -> list[int]:
        """Steps whose schedule() preempted the request (notebook 02's 6-block pool: request "2" at [6])."""
        return [e["step"] for e in self.of_kind("schedule") if request_id in e["preempted_req_ids"]]

    def resumed_at(self, request_id: str) -> list[int]:
        """Steps that scheduled the request again after a preemption (resumed_from_preemption; notebook 02: [13])."""
        cached = [(e["step"], e["scheduled_cached_reqs"]) for e in self.of_kind("schedule")]
        return [step for step, c in cached
                for r, resumed in zip(c["req_ids"], c["resumed_from_preemption"]) if r == request_id and resumed]

    def finished_at(self, request_id: str) -> int | None:
        """The step whose update_from_output finished the request, or None."""
        return next((e["step"] for e in self.of_kind("update")
                     for o in e["outputs"] if o["request_id"] == request_id and o["finish_reason"]), None)

    def block_owners(self, step: int) -> dict[int, str]:
        """{block id: request id} for the blocks of every request scheduled in `step`, right after schedule()."""
        tables = self.by_step()[step]["schedule"]["block_tables"]
        return {block: r for r, blocks in tables.items() for block in blocks}

    def num_computed_tokens(self) -> dict[str, dict[int, int]]:
        """{request_id: {step: num_computed_tokens after that step}}; 0 from a preemption until it resumes."""
        state: dict[str, int] = {}
        out: dict[str, dict[int, int]] = {}
        for step, ev in sorted(self.by_step().items()):
            sched, cached = ev["schedule"], ev["schedule"]["scheduled_cached_reqs"]
            state.update({r: 0 for r in sched["preempted_req_ids"]})
            state.update({n["req_id"]: n["num_computed_tokens"] for n in sched["scheduled_new_reqs"]})
            state.update(zip(cached["req_ids"], cached["num_computed_tokens"]))
            for r, n in sched["num_scheduled_tokens"].items():
                state[r] += n
            for r, v in state.items():
                out.setdefault(r, {})[step] = v
            for o in ev.get("update", {}).get("outputs", []):
                if o["finish_reason"]:
                    state.pop(o["request_id"], None)
        return out

    def summary(self) -> dict[str, Any]:
        schedules = self.of_kind("schedule")
        usable = self.info["num_gpu_blocks"] - 1
        return {"steps": len(schedules),
                "scheduled_tokens": sum(e["total_num_scheduled_tokens"] for e in schedules),
                "generated_tokens": sum(len(o["new_token_ids"]) for e in self.of_kind("update") for o in e["outputs"]),
                "preemptions": sum(len(e["preempted_req_ids"]) for e in schedules),
                "peak_blocks": max((usable - e["num_free_blocks"] for e in schedules), default=0),
                "num_gpu_blocks": self.info["num_gpu_blocks"]}

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"info": self.info, "caller_pid": self.caller_pid,
                                          "events": self.events}, indent=1))

    def write_html(self, path: str | Path, config=None) -> None:
        """Write this run as a trace-viewer file (tracing/html.py) and print its path, nothing else: a
        notebook's last cell calls it, and no HTML lands in the stored outputs."""
        from minivllm.tracing.html import write_html
        write_html(self, path, config)
        print(path)

    @classmethod
    def from_json(cls, path: str | Path) -> "Trace":
        data = json.loads(Path(path).read_text())
        return cls(data["info"], data["events"], data["caller_pid"])
