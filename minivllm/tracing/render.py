"""Print a Trace: one console factory so the terminal, notebooks and tests show the same characters.

`make_console` gives plain text at a fixed width whenever output is not a
terminal (and never Jupyter widgets), so nbval and tests can compare it.
`render_trace` prints the first steps in full (SchedulerOutput, the packed
batch, what attention pulled, sampling, the update) and later steps one line each.
"""
from __future__ import annotations

import sys
from typing import Callable

from rich import box
from rich.console import Console
from rich.table import Table

from minivllm.tracing.tracer import Trace

WIDTH = 120


def make_console(file=None, width: int = WIDTH) -> Console:
    file = file or sys.stdout
    terminal = hasattr(file, "isatty") and file.isatty()
    return Console(file=file, width=width, force_jupyter=False, force_terminal=terminal,
                   color_system="standard" if terminal else None, highlight=False, soft_wrap=False,
                   emoji=False, markup=False)


def fmt_list(values, limit: int = 20) -> str:
    values = list(values)
    if len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    head, tail = values[:limit - 4], values[-3:]
    return "[" + ", ".join(map(str, head)) + ", ..., " + ", ".join(map(str, tail)) + f"] (n={len(values)})"


def render_scheduler_output(event: dict, console: Console) -> None:
    """The SchedulerOutput of one step, plus the queues and free blocks right after schedule()."""
    table = Table(title=f"SchedulerOutput (step {event['step']})", box=box.ASCII, title_justify="left")
    for col in ("kind", "req_id", "num_computed_tokens", "num_scheduled_tokens", "block_ids"):
        table.add_column(col)
    nst = event["num_scheduled_tokens"]
    for new in event["scheduled_new_reqs"]:
        table.add_row("new", new["req_id"], str(new["num_computed_tokens"]), str(nst[new["req_id"]]),
                      fmt_list(new["block_ids"], 12))
    cached = event["scheduled_cached_reqs"]
    for i, req_id in enumerate(cached["req_ids"]):
        kind = "cached (resumed)" if cached["resumed_from_preemption"][i] else "cached"
        table.add_row(kind, req_id, str(cached["num_computed_tokens"][i]), str(nst[req_id]),
                      "+" + fmt_list(cached["new_block_ids"][i], 12))
    console.print(table)
    console.print(f"total_num_scheduled_tokens={event['total_num_scheduled_tokens']}  "
                  f"finished_req_ids={fmt_list(event['finished_req_ids'])}  "
                  f"preempted_req_ids={fmt_list(event['preempted_req_ids'])}")
    console.print(f"WAITING {fmt_list(event['waiting'])}  RUNNING {fmt_list(event['running'])}  "
                  f"free blocks {event['num_free_blocks']}")


def render_batch(event: dict, console: Console) -> None:
    """The packed batch of one step: every array on the one token dimension, and each block_table row."""
    b = event["batch"]
    step = f" (step {event['step']})" if "step" in event else ""
    console.print(f"packed batch{step}: req_ids={fmt_list(b['req_ids'])}")
    for name in ("input_ids", "positions", "num_scheduled_tokens", "query_start_loc", "seq_lens", "slot_mapping",
                 "logits_indices"):
        console.print(f"  {name:<21}= {fmt_list(b[name])}")
    for req_id, row in zip(b["req_ids"], b["block_table"]):
        console.print(f"  block_table[{req_id}]".ljust(24) + f"= {fmt_list(row, 16)}")
    a = event.get("attention")
    if a:
        console.print(f"  {a['layer_name']} pulled from forward_context: attn_metadata(num_actual_tokens="
                      f"{a['num_actual_tokens']}, max_query_len={a['max_query_len']}, max_seq_len={a['max_seq_len']}, "
                      f"block_table{a['block_table_shape']}), kv_cache{a['kv_cache_shape']}, "
                      f"slot_mapping[{a['slot_mapping_len']}]")


def render_update(execute: dict | None, update: dict, console: Console, decode: Callable) -> None:
    if execute is not None:
        rows = dict(zip(execute["batch"]["req_ids"], range(len(execute["batch"]["req_ids"]))))
        picks = [f"{r}: row {execute['batch']['query_start_loc'][rows[r] + 1] - 1} -> {t} {decode(t)!r}"
                 for r, t in execute["sampled"].items()]
        console.print("sample: logits_indices -> sampled_token_ids: " + ("; ".join(picks) or "nothing (partial prefill)"))
    for out in update["outputs"]:
        if out["finish_reason"]:
            reason = out["finish_reason"] + (f" ({out['stop_reason']!r})" if out["stop_reason"] is not None else "")
            console.print(f"update: {out['request_id']} finished: {reason}; blocks "
                          f"{fmt_list(update['freed'].get(out['request_id'], []))} returned to the pool")
    console.print(f"update_from_output: free blocks {update['num_free_blocks']}, RUNNING {fmt_list(update['running'])}, "
                  f"WAITING {fmt_list(update['waiting'])}")


def step_line(sched: dict, update: dict, decode: Callable) -> str:
    tokens = ", ".join(f"{o['request_id']}:{decode(o['new_token_ids'][0])!r}" for o in update["outputs"]
                       if o["new_token_ids"])
    ends = [f"{o['request_id']} {o['finish_reason']}" for o in update["outputs"] if o["finish_reason"]]
    line = (f"step {sched['step']:>3}  scheduled {sched['num_scheduled_tokens']}  free {sched['num_free_blocks']}"
            f"  tokens {tokens}")
    if sched["preempted_req_ids"]:
        line += f"  PREEMPTED {fmt_list(sched['preempted_req_ids'])}"
    cached = sched["scheduled_cached_reqs"]
    resumed = [r for r, flag in zip(cached["req_ids"], cached["resumed_from_preemption"]) if flag]
    if resumed:
        line += f"  RESUMED (recompute) {fmt_list(resumed)}"
    return line + (f"  finished {', '.join(ends)}" if ends else "")


def render_trace(trace: Trace, console: Console, full_steps: int = 3, focus: str | None = None,
                 decode: Callable[[int], str] = str) -> None:
    info = trace.info
    if focus is None:  # the first request submitted is the one the trace follows
        focus = next((e["request_id"] for e in trace.of_kind("submit")), "0")
    where = "a child process (IPC queues)" if trace.multiprocess else "the caller's process"
    console.rule("minivllm trace")
    console.print(f"EngineCore runs in {where}")
    console.print(f"{info['num_gpu_blocks']} KV blocks of {info['block_size']} tokens (block 0 reserved), "
                  f"max_model_len={info['max_model_len']}, {info['attention_backend']} attention")
    events = trace.events
    by_step: dict[int, dict] = {}
    for e in events:
        if "step" in e:
            by_step.setdefault(e["step"], {})[e["kind"]] = e
    shown_line_header = False
    for e in events:
        kind = e["kind"]
        if kind == "submit":
            console.print(f"[caller]     add_request({e['request_id']}): {len(e['prompt_token_ids'])} prompt tokens "
                          f"{fmt_list(e['prompt_token_ids'], 12)} -> EngineCoreRequest on the input queue")
        elif kind == "arrival":
            console.print(f"[EngineCore] scheduler.add_request({e['request_id']}) -> WAITING {fmt_list(e['waiting'])}")
        elif kind == "abort":
            console.print(f"[EngineCore] abort_requests({fmt_list(e['request_ids'])}): blocks returned, "
                          f"free {e['num_free_blocks']}")
        elif kind == "schedule":
            step = by_step[e["step"]]
            if "update" not in step:
                continue
            if e["step"] <= full_steps:
                console.rule(f"EngineCore.step() #{e['step']}: schedule -> execute_model -> update_from_output")
                render_scheduler_output(e, console)
                if "execute" in step:
                    render_batch(step["execute"], console)
                render_update(step.get("execute"), step["update"], console, decode)
            else:
                if not shown_line_header:
                    console.rule("later steps, one line each")
                    shown_line_header = True
                console.print(step_line(e, step["update"], decode))
        elif kind == "outputs" and any(o["finished"] for o in e["outputs"]):
            for o in e["outputs"]:
                if o["finished"]:
                    console.print(f"[caller]     RequestOutput({o['request_id']}) finished="
                                  f"{o['finish_reason']}: {len(o['token_ids'])} tokens, text {o['text'][:60]!r}")
    final = [o for e in trace.of_kind("outputs") for o in e["outputs"] if o["request_id"] == focus and o["finished"]]
    console.rule(f"request {focus}")
    prompt = next((e["prompt"] for e in trace.of_kind("submit") if e["request_id"] == focus), None)
    if prompt is not None:
        console.print(f"prompt: {prompt!r}")
    if final:
        console.print(f"text: {final[-1]['text']!r}")
    s = trace.summary()
    console.print(f"summary: {s['steps']} steps, {s['scheduled_tokens']} tokens scheduled, {s['generated_tokens']} "
                  f"generated, {s['preemptions']} preemptions, peak {s['peak_blocks']} of {s['num_gpu_blocks'] - 1} "
                  f"blocks in use")
