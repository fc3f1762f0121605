"""The caller's record of a traced run (Trace): the engine's facts plus every event from both processes, in order,
and the read-only views the renderer, the figures, the notebooks and the tests ask of it. EngineTracer
(tracing/tracer.py) makes the EngineCore side's events."""
from __future__ import annotations

import json
import os
import weakref
from pathlib import Path
from typing import Any, Callable


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
            for r, spec in ev.get("update", {}).get("spec_decode", {}).items():
                state[r] -= spec["num_rejected"]  # update_from_output rolled the rejected drafts back
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


def run_traced(llm, requests: list[tuple]):
    """Submit (prompt, SamplingParams) pairs in one message, run them to the end with tracing on.

    Returns the Trace. `llm.generate` would give the same tokens: tracing only observes, and is off again after.
    """
    engine = llm.llm_engine
    engine.enable_tracing()
    try:
        engine.add_processed_requests([engine.process_inputs(engine.next_request_id(), p, sp) for p, sp in requests])
        while engine.has_unfinished_requests():
            engine.step()
        return engine.collect_trace()
    finally:
        engine.disable_tracing()
