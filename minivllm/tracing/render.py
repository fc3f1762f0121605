"""Print a Trace: one console factory so the terminal, notebooks and tests show the same characters.

`make_console` gives plain text at a fixed width (80 unless told) and never
Jupyter widgets, so nbval and tests can compare it; `terminal_width` is what
`make trace` passes instead when it prints to a terminal. Every line is
wrapped to the console's width with a hanging indent, and a text that must
fit one line is cut with a visible "…", never silently. `render_trace` prints
in full each step where something happens (an admission, a preemption, a
resume, a finish, a prefill chunk of the followed request) and one line for
every other step.
"""
from __future__ import annotations

import shutil
import sys
import textwrap
from typing import Callable

from rich import box
from rich.console import Console
from rich.table import Table

from minivllm.tracing.overlap import HEADER, async_notes
from minivllm.tracing.prefix import prefix_hit_notes
from minivllm.tracing.ranks import rank_lines
from minivllm.tracing.spec import draft_notes, step_token, verify_lines
from minivllm.tracing.text import NBSP, atom, clip, fmt_list  # noqa: F401  (fmt_list: notebooks use it)
from minivllm.tracing.trace import Trace

WIDTH = 80       # notebooks, tests and piped output: the width a reader has beside the article
MIN_WIDTH = 40   # below this no layout stays readable
WIDE = 100       # from here on, tables spell out vLLM's field names


def terminal_width(default: int = WIDTH) -> int:
    """$COLUMNS if set, else the terminal's width, else `default` (output piped or captured)."""
    return max(MIN_WIDTH, shutil.get_terminal_size((default, 24)).columns)


def make_console(file=None, width: int = WIDTH) -> Console:
    file = file or sys.stdout
    terminal = hasattr(file, "isatty") and file.isatty()
    return Console(file=file, width=width, force_jupyter=False, force_terminal=terminal,
                   color_system="standard" if terminal else None, highlight=False, soft_wrap=False,
                   emoji=False, markup=False)


def put(console: Console, head: str, body: str = "") -> None:
    """Print head + body wrapped at the console width, continuation lines indented under the body.

    E.g. at width 30: put(c, "  slot_mapping = ", "[16, 17, 18, 19, 32, 33]") prints
    "  slot_mapping = [16, 17, 18," then "                 19, 32, 33]".
    """
    hang = len(head) if len(head) <= console.width // 2 else 4
    lines = textwrap.wrap(head + body, console.width, subsequent_indent=" " * hang, break_on_hyphens=False)
    for line in lines or [""]:
        console.print(line.replace(NBSP, " "))



def queues(waiting, running) -> str:
    return f"WAITING (next first) {fmt_list(waiting)}  RUNNING {fmt_list(running)}"


def render_scheduler_output(event: dict, console: Console) -> None:
    """The SchedulerOutput of one step, plus the queues and free blocks right after schedule()."""
    wide = console.width >= WIDE
    put(console, f"SchedulerOutput (step {event['step']})")
    table = Table(box=box.ASCII)
    for col in ("req_id", "kind", "num_computed_tokens" if wide else "computed",
                "num_scheduled_tokens" if wide else "scheduled", "block_ids"):
        table.add_column(col, justify="right" if col[0] in "cns" else "left", overflow="fold")
    nst = event["num_scheduled_tokens"]
    for new in event["scheduled_new_reqs"]:
        table.add_row(new["req_id"], "new", str(new["num_computed_tokens"]), str(nst[new["req_id"]]),
                      fmt_list(new["block_ids"], 12))
    cached = event["scheduled_cached_reqs"]
    for i, req_id in enumerate(cached["req_ids"]):
        table.add_row(req_id, "resumed" if cached["resumed_from_preemption"][i] else "cached",
                      str(cached["num_computed_tokens"][i]), str(nst[req_id]), "+" + fmt_list(cached["new_block_ids"][i], 12))
    console.print(table)
    if not wide:
        put(console, "  computed: num_computed_tokens before the step; scheduled: num_scheduled_tokens")
    put(console, "", f"total_num_scheduled_tokens={event['total_num_scheduled_tokens']}  "
                     f"finished_req_ids={atom(fmt_list(event['finished_req_ids']))}  "
                     f"preempted_req_ids={atom(fmt_list(event['preempted_req_ids']))}")
    if event.get("scheduled_spec_decode_tokens"):
        put(console, "", f"scheduled_spec_decode_tokens={atom(str(event['scheduled_spec_decode_tokens']))}")
    put(console, "after schedule(): ", f"{queues(event['waiting'], event['running'])}  "
                                       f"free blocks {event['num_free_blocks']}")


def render_batch(event: dict, console: Console) -> None:
    """The packed batch of one step: every array on the one token dimension, and each block_table row."""
    b = event["batch"]
    step = f" (step {event['step']})" if "step" in event else ""
    put(console, f"packed batch{step}: ", f"req_ids={fmt_list(b['req_ids'])}")
    for name in ("input_ids", "positions", "num_scheduled_tokens", "query_start_loc", "seq_lens", "slot_mapping",
                 "logits_indices"):
        put(console, f"  {name:<21}= ", fmt_list(b[name]))
    for req_id, row in zip(b["req_ids"], b["block_table"]):
        put(console, f"  block_table[{req_id}]".ljust(23) + "= ", fmt_list(row, 16))
    a = event.get("attention")
    if a:
        put(console, f"  {a['layer_name']} pulled from forward_context:")
        put(console, "    ", f"attn_metadata(num_actual_tokens={a['num_actual_tokens']}, "
                             f"max_query_len={a['max_query_len']}, max_seq_len={a['max_seq_len']}, "
                             f"{atom('block_table' + str(a['block_table_shape']))}), "
                             f"{atom('kv_cache' + str(a['kv_cache_shape']))}, slot_mapping[{a['slot_mapping_len']}]")


def render_update(execute: dict | None, update: dict, console: Console, decode: Callable) -> None:
    if execute is not None:
        rows = {r: i for i, r in enumerate(execute["batch"]["req_ids"])}
        picks = [atom(f"{r}: row {execute['batch']['query_start_loc'][rows[r] + 1] - 1} -> {t} {decode(t)!r}")
                 for r, t in execute["sampled"].items() if r not in update.get("spec_decode", {})]
        verified = verify_lines(execute, update, decode)
        if picks or not verified:
            put(console, "sample: logits_indices -> sampled_token_ids: ", "; ".join(picks) or "nothing (partial "
                                                                                              "prefill)")
        for line in verified:
            put(console, "rejection sampler: ", line)
    for out in update["outputs"]:
        if out["finish_reason"]:
            reason = out["finish_reason"] + (f" ({out['stop_reason']!r})" if out["stop_reason"] is not None else "")
            put(console, "update: ", f"{out['request_id']} finished: {reason}; blocks "
                                     f"{atom(fmt_list(update['freed'].get(out['request_id'], [])))} returned to the pool")
    put(console, "update_from_output: ", f"free blocks {update['num_free_blocks']}  "
                                         f"{queues(update['waiting'], update['running'])}")


def happenings(sched: dict, update: dict, focus: str, prompt_lens: dict[str, int]) -> list[str]:
    """What this step did to the queues or to the followed request; empty for a plain decode step."""
    nst, notes = sched["num_scheduled_tokens"], []
    for new in sched["scheduled_new_reqs"]:
        hit, n, total = new["num_computed_tokens"], nst[new["req_id"]], new["num_prompt_tokens"]
        part = f"all {total} prompt tokens" if n == total else f"{n} of {total} prompt tokens"
        part += f" after {hit} found in the prefix cache" if hit else ""
        part += " (a chunk)" if hit + n < total else ""
        notes.append(f"{new['req_id']} admitted from WAITING: {part}")
    cached = sched["scheduled_cached_reqs"]
    computed = dict(zip(cached["req_ids"], cached["num_computed_tokens"]))
    computed.update({new["req_id"]: new["num_computed_tokens"] for new in sched["scheduled_new_reqs"]})
    for req_id, resumed in zip(cached["req_ids"], cached["resumed_from_preemption"]):
        if resumed:  # preemption reset num_computed_tokens to 0; more than 0 now: a prefix-cache hit on resume
            hit = computed[req_id]
            found = f"its first {hit} tokens are a prefix-cache hit, so it " if hit else "nothing cached: it "
            notes.append(f"{req_id} resumed from WAITING: {found}recomputes {nst[req_id]} tokens from "
                         f"num_computed_tokens={hit}")
    for req_id in sched["preempted_req_ids"]:
        notes.append(f"{req_id} preempted: blocks freed, num_computed_tokens=0, prepended to WAITING")
    admitted = {n["req_id"] for n in sched["scheduled_new_reqs"]}
    admitted.update(r for r, resumed in zip(cached["req_ids"], cached["resumed_from_preemption"]) if resumed)
    if focus in nst and focus not in admitted and computed[focus] < prompt_lens.get(focus, 0):
        start = computed[focus]
        notes.append(f"{focus} prefill chunk: prompt tokens {start}..{start + nst[focus] - 1} of {prompt_lens[focus]}")
    for out in update["outputs"]:
        if out["finish_reason"]:
            notes.append(f"{out['request_id']} finished ({out['finish_reason']})")
    return notes


def step_line(sched: dict, update: dict, decode: Callable) -> str:
    """One step in a line: request:token sampled (a prefill chunk shows its size), free blocks after it."""
    sampled = {o["request_id"]: o["new_token_ids"] for o in update["outputs"] if o["new_token_ids"]}
    spec = update.get("spec_decode", {})
    line = "  ".join(step_token(r, n, sampled.get(r), spec.get(r), decode)
                     for r, n in sched["num_scheduled_tokens"].items()) + f"  free {update['num_free_blocks']}"
    if sched["finished_req_ids"]:
        line += f"  finished_req_ids={atom(fmt_list(sched['finished_req_ids']))}"
    return line


def render_trace(trace: Trace, console: Console, full_steps: int = 0, focus: str | None = None,
                 decode: Callable[[int], str] = str) -> None:
    """Print the trace: each eventful step in full (and the first `full_steps` steps), the rest one line each."""
    info, w = trace.info, console.width
    if focus is None:  # the first request submitted is the one the trace follows
        focus = next((e["request_id"] for e in trace.of_kind("submit")), "0")
    prompt_lens = {e["request_id"]: len(e["prompt_token_ids"]) for e in trace.of_kind("submit")}
    prompt_lens.update({e["request_id"]: e["num_prompt_tokens"] for e in trace.of_kind("arrival")})
    where = "a child process (IPC queues)" if trace.multiprocess else "the caller's process"
    console.rule("minivllm trace")
    put(console, "", f"EngineCore runs in {where}")
    if info.get("tensor_parallel_size", 1) > 1:
        put(console, "", f"model_executor: MultiprocExecutor, {info['tensor_parallel_size']} worker processes "
                         f"(tensor_parallel_size={info['tensor_parallel_size']})")
    put(console, "", f"{info['num_gpu_blocks']} KV blocks of {info['block_size']} tokens (block 0 reserved), "
                     f"max_model_len={info['max_model_len']}, {info['attention_backend']} attention")
    if info.get("async_scheduling"):
        put(console, "", HEADER)
    put(console, "", f"Following request {focus}. A step that admits, preempts, resumes or finishes a request, or "
                     f"runs a prefill chunk of {focus}, prints in full; any other prints one line: "
                     f"request:sampled token, free blocks.")
    by_step: dict[int, dict] = {}
    ranks_shown = False  # the tensor-parallel ranks print once, at the first full step
    for e in trace.events:
        if "step" in e:
            by_step.setdefault(e["step"], {})[e["kind"]] = e
    for e in trace.events:
        kind = e["kind"]
        if kind == "submit":
            put(console, "[caller]     ", f"add_request({e['request_id']}): {len(e['prompt_token_ids'])} prompt tokens "
                                          f"{fmt_list(e['prompt_token_ids'], 12)} -> EngineCoreRequest on the input queue")
        elif kind == "arrival":
            put(console, "[EngineCore] ", f"scheduler.add_request({e['request_id']}) -> WAITING {fmt_list(e['waiting'])}")
        elif kind == "abort":
            put(console, "[EngineCore] ", f"abort_requests({fmt_list(e['request_ids'])}): blocks returned, "
                                          f"free {e['num_free_blocks']}")
        elif kind == "schedule":
            step = by_step[e["step"]]
            if "update" not in step:
                continue
            notes = happenings(e, step["update"], focus, prompt_lens) + prefix_hit_notes(e, info["block_size"])
            notes += draft_notes(step["update"], focus)
            overlap = async_notes(e, step["update"], by_step.get(e["step"] - 1, {}).get("execute"))
            if notes or e["step"] <= full_steps:
                notes += overlap
                console.rule(f"EngineCore.step() #{e['step']}: schedule -> execute_model -> update_from_output")
                for note in notes:
                    put(console, "  * ", note)
                render_scheduler_output(e, console)
                if "execute" in step:
                    render_batch(step["execute"], console)
                    if "ranks" in step["execute"] and not ranks_shown:
                        for head, body in rank_lines(step["execute"]["ranks"]):
                            put(console, head, body)
                        ranks_shown = True
                render_update(step.get("execute"), step["update"], console, decode)
            else:
                put(console, f"step {e['step']:>3}  ", step_line(e, step["update"], decode))
                for note in overlap:
                    put(console, "          ", note)
        elif kind == "outputs":
            for o in e["outputs"]:
                if o["finished"]:
                    put(console, "[caller]     ", f"RequestOutput({o['request_id']}) finished={o['finish_reason']}: "
                                                  f"{len(o['token_ids'])} tokens")
                    put(console, " " * 13, "text=" + atom(clip(o["text"], max(16, w - 18))))
    final = [o for e in trace.of_kind("outputs") for o in e["outputs"] if o["request_id"] == focus and o["finished"]]
    console.rule(f"request {focus}")
    prompt = next((e["prompt"] for e in trace.of_kind("submit") if e["request_id"] == focus), None)
    if prompt is not None:
        put(console, "prompt: ", repr(prompt))
    if final:
        put(console, "text: ", repr(final[-1]["text"]))
    s = trace.summary()
    put(console, "summary: ", f"{s['steps']} steps, {s['scheduled_tokens']} tokens scheduled, {s['generated_tokens']} "
                              f"generated, {s['preemptions']} preemptions, peak {s['peak_blocks']} of "
                              f"{s['num_gpu_blocks'] - 1} blocks in use")
