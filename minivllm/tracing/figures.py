"""Figures for the article, each drawn with matplotlib from a real traced run of the engine (no vLLM counterpart).

`python -m minivllm.tracing.figures --out figures` runs the traced engine three
times in-process (default settings; a 4-token budget for chunked prefill; a
6-block pool for preemption) and writes eight PNGs: the counterparts of the
article's figures 2-8 plus a step timeline. Nothing is drawn by hand: every
number, label, colour assignment and arrow comes from a `Trace` (the
SchedulerOutput, packed batch, attention metadata and updates the engine
recorded). Each `fig_*` function takes a Trace and returns a matplotlib Figure,
so notebooks and tests draw the same pictures from their own runs. Images hold
no pids or timestamps. Left out: swap preemption (vLLM V1 recomputes, so the
preemption figure shows recompute and says so) and anything the trace does not
record (timings, tensor values beyond token ids and indices).
"""
from __future__ import annotations

import argparse
import io
import re
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.patches import ConnectionPatch, FancyBboxPatch, Rectangle  # noqa: E402

from minivllm.tracing.tracer import Trace  # noqa: E402

SIZE, DPI = (12, 6.5), 110
GREY, LIGHT = "#bbbbbb", "#eeeeee"
RUNS = {"default": ["--max-tokens", "24"],
        "small_budget": ["--max-num-batched-tokens", "4", "--max-tokens", "8", "--neighbours", "2"],
        "small_pool": ["--num-blocks", "6", "--block-size", "8", "--max-tokens", "12", "--neighbours", "2"]}


# ---------------------------------------------------------------- trace helpers
def steps(trace: Trace) -> dict[int, dict]:
    """{step: {"schedule": ..., "execute": ..., "update": ...}} for every step the engine ran."""
    out: dict[int, dict] = {}
    for e in trace.events:
        if "step" in e:
            out.setdefault(e["step"], {})[e["kind"]] = e
    return out


def colors(trace: Trace) -> dict[str, tuple]:
    palette = plt.get_cmap("tab10").colors
    return {e["request_id"]: palette[i % 10] for i, e in enumerate(trace.of_kind("arrival"))}


def prompt_lens(trace: Trace) -> dict[str, int]:
    return {e["request_id"]: e["num_prompt_tokens"] for e in trace.of_kind("arrival")}


def mixed_step(trace: Trace) -> int:
    """The step mixing a multi-token prefill with decodes that has the most requests (else the first step)."""
    executes = trace.of_kind("execute")
    mixed = [e for e in executes if max(e["batch"]["num_scheduled_tokens"]) > 1
             and min(e["batch"]["num_scheduled_tokens"]) == 1]
    return max(mixed, key=lambda e: (len(e["batch"]["req_ids"]), -e["step"]))["step"] if mixed else executes[0]["step"]


def split_budget(sched: dict) -> tuple[dict[str, int], dict[str, int]]:
    """(RUNNING tokens, WAITING-admitted tokens) of one SchedulerOutput, in scheduling order."""
    nst, cached = sched["num_scheduled_tokens"], sched["scheduled_cached_reqs"]
    running = {r: nst[r] for r, resumed in zip(cached["req_ids"], cached["resumed_from_preemption"]) if not resumed}
    admitted = {r: nst[r] for r, resumed in zip(cached["req_ids"], cached["resumed_from_preemption"]) if resumed}
    admitted.update({n["req_id"]: nst[n["req_id"]] for n in sched["scheduled_new_reqs"]})
    return running, admitted


def computed_tokens(trace: Trace) -> dict[str, dict[int, int]]:
    """num_computed_tokens of every request after each step: drops to 0 when preempted."""
    state, out = {}, {}
    for s, ev in sorted(steps(trace).items()):
        sched = ev["schedule"]
        for r in sched["preempted_req_ids"]:
            state[r] = 0
        for n in sched["scheduled_new_reqs"]:
            state[n["req_id"]] = n["num_computed_tokens"] + sched["num_scheduled_tokens"][n["req_id"]]
        c = sched["scheduled_cached_reqs"]
        for r, nct in zip(c["req_ids"], c["num_computed_tokens"]):
            state[r] = nct + sched["num_scheduled_tokens"][r]
        for r, v in state.items():
            out.setdefault(r, {})[s] = v
        for o in ev.get("update", {}).get("outputs", []):
            if o["finish_reason"]:
                state.pop(o["request_id"], None)
    return out


def _box(ax, x, y, text, color=LIGHT, w=2.6, h=0.8, fs=9, **kw):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05", fc=color, ec="black", **kw))
    ax.text(x, y, text, ha="center", va="center", fontsize=fs)


def _arrow(ax, xy_from, xy_to, text="", color="black", fs=8, side=1, **kw):
    ax.annotate("", xy=xy_to, xytext=xy_from, arrowprops=dict(arrowstyle="-|>", color=color, lw=1.3, **kw))
    if text:  # side=1: label right of the arrow's midpoint, side=-1: left of it
        ax.text((xy_from[0] + xy_to[0]) / 2 + 0.15 * side, (xy_from[1] + xy_to[1]) / 2, text, fontsize=fs, color=color,
                ha="left" if side > 0 else "right", va="center")


def _figure(nrows=1, ncols=1, **kw):
    return plt.subplots(nrows, ncols, figsize=SIZE, dpi=DPI, **kw)


# ---------------------------------------------------------------- the figures
def fig_process_boundary(trace: Trace) -> plt.Figure:
    fig, ax = _figure()
    ax.set(xlim=(0, 10), ylim=(0, 6.4)); ax.axis("off")
    n_req, n_steps, n_outs = len(trace.of_kind("submit")), len(trace.of_kind("update")), len(trace.of_kind("outputs"))
    s, info = trace.summary(), trace.info
    ax.text(0.1, 6.2, "caller process", fontsize=12, weight="bold", va="top")
    ax.text(0.1, 2.95, "EngineCore process (a child process by default)", fontsize=12, weight="bold", va="top")
    ax.axhline(3.25, color="black", ls="--", lw=1.5)
    ax.text(0.1, 3.32, "process boundary (IPC queues)", fontsize=9, style="italic")
    _box(ax, 1.7, 4.5, "LLM\ngenerate()")
    _box(ax, 5.0, 4.5, f"LLMEngine\nstep(): get_output() -> detokenize\n{n_outs} RequestOutput batches", w=3.0, h=1.0)
    _box(ax, 8.4, 4.5, "EngineCoreClient\n(input / output queues)")
    _arrow(ax, (3.0, 4.5), (3.5, 4.5)); _arrow(ax, (6.5, 4.5), (7.1, 4.5))
    ax.text(3.25, 4.75, "owns", ha="center", fontsize=8); ax.text(6.8, 4.75, "owns", ha="center", fontsize=8)
    _box(ax, 5.0, 2.0, f"EngineCore  run_busy_loop()\n{n_steps} steps: schedule -> execute_model -> update_from_output",
         w=5.2)
    _arrow(ax, (8.0, 4.05), (6.4, 2.45), f"{n_req} requests submitted\n(EngineCoreRequest, input queue)", color="tab:blue", side=-1)
    _arrow(ax, (7.0, 2.45), (8.8, 4.05), f"{n_steps} EngineCoreOutputs received\n(one per step, output queue)", color="tab:red")
    children = [(1.7, f"Scheduler\nWAITING / RUNNING queues\n{s['preemptions']} preemptions"),
                (5.0, f"KVCacheManager -> BlockPool\n{info['num_gpu_blocks']} blocks x {info['block_size']} tokens"
                      f"\npeak {s['peak_blocks']} blocks in use"),
                (8.3, f"GPUModelRunner\n{info['attention_backend']} attention\n{s['scheduled_tokens']} tokens run")]
    for x, text in children:
        _box(ax, x, 0.6, text, w=3.0, h=1.0)
        _arrow(ax, (5.0 + (x - 5.0) * 0.3, 1.55), (x, 1.15))
    ax.set_title("Class ownership across the process boundary (counts from one traced run)", fontsize=13)
    return fig


def fig_schedule_step(trace: Trace, token_budget: int, step: int | None = None) -> plt.Figure:
    scheds = trace.of_kind("schedule")
    if step is None:  # prefer a step that serves RUNNING and also admits a partial prefill chunk
        def score(e):
            running, admitted = split_budget(e)
            chunk = any(n["num_computed_tokens"] + e["num_scheduled_tokens"][n["req_id"]] < n["num_prompt_tokens"]
                        for n in e["scheduled_new_reqs"])
            return bool(running) and bool(admitted), chunk, -e["step"]
        step = max(scheds, key=score)["step"]
    ev = steps(trace)[step]
    sched, col, plens = ev["schedule"], colors(trace), prompt_lens(trace)
    running, admitted = split_budget(sched)
    fig, (ax, aq) = _figure(2, 1, gridspec_kw={"height_ratios": [1, 1.3]})
    left, nct = 0, {n["req_id"]: n["num_computed_tokens"] for n in sched["scheduled_new_reqs"]}
    nct.update(zip(sched["scheduled_cached_reqs"]["req_ids"], sched["scheduled_cached_reqs"]["num_computed_tokens"]))
    for group, reqs in (("pass 1: RUNNING", running), ("pass 2: WAITING admitted", admitted)):
        start = left
        for r, n in reqs.items():
            done = nct[r]
            kind = "decode" if done >= plens[r] else f"prefill chunk:\nprompt tokens [{done}, {done + n}) of {plens[r]}"
            ax.barh(0, n, left=left, color=col[r], ec="black", label=f"req {r}")
            ax.text(left + n / 2, 0, f"req {r}\n{n} tok\n{kind}", ha="center", va="center", fontsize=8)
            left += n
        if reqs:
            ax.annotate("", xy=(start, 0.55), xytext=(left, 0.55), arrowprops=dict(arrowstyle="|-|", lw=1))
            ax.text((start + left) / 2, 0.62, f"{group}: {left - start}", ha="center", va="bottom", fontsize=9)
    ax.barh(0, token_budget - left, left=left, color="white", ec="black", hatch="//", label="leftover")
    note = " (the chunk was clamped: num_new_tokens = min(num_new_tokens, token_budget))" if left == token_budget else ""
    ax.text(token_budget, -0.62, f"leftover {token_budget - left}{note}", ha="right", va="top", fontsize=9)
    ax.set(xlim=(0, token_budget), ylim=(-1, 1.1), yticks=[], xticks=range(token_budget + 1),
           xlabel="tokens of the step's budget")
    ax.set_title(f"One schedule() step (step {step}): token budget max_num_batched_tokens = {token_budget}", fontsize=12)
    prev = steps(trace).get(step - 1, {}).get("update")
    before = (prev["running"], prev["waiting"]) if prev else ([], trace.of_kind("arrival")[-1]["waiting"])
    rows = [("before: RUNNING", before[0]), ("before: WAITING", before[1]),
            ("after: RUNNING", sched["running"]), ("after: WAITING", sched["waiting"])]
    for y, (name, ids) in enumerate(reversed(rows)):
        aq.text(-0.2, y, name, ha="right", va="center", fontsize=9)
        for x, r in enumerate(ids):
            aq.add_patch(Rectangle((x, y - 0.35), 0.9, 0.7, fc=col[r], ec="black"))
            aq.text(x + 0.45, y, f"req {r}", ha="center", va="center", fontsize=8)
    aq.set(xlim=(-2.2, max(6, len(col))), ylim=(-0.6, 3.6)); aq.axis("off")
    aq.set_title(f"queues around schedule(); free blocks after: {sched['num_free_blocks']}, "
                 f"preempted: {sched['preempted_req_ids'] or 'none'}", fontsize=10)
    fig.tight_layout()
    return fig


def fig_preemption(trace: Trace) -> plt.Figure:
    by_step, col = steps(trace), colors(trace)
    preempted = sorted({r for e in trace.of_kind("schedule") for r in e["preempted_req_ids"]}, key=lambda r: (len(r), r))
    fig, ax = _figure()
    ax2 = ax.twinx()
    xs = sorted(by_step)
    ax2.step(xs, [by_step[s]["schedule"]["num_free_blocks"] for s in xs], where="mid", color=GREY, ls="--",
             label="free blocks (after schedule)")
    ax2.set_ylabel("free KV blocks"); ax2.set_ylim(0, trace.info["num_gpu_blocks"])
    for r, series in computed_tokens(trace).items():
        if r not in preempted:
            continue
        ss = sorted(series)
        ax.plot(ss, [series[s] for s in ss], "o-", color=col[r], label=f"req {r} num_computed_tokens")
        for s in ss:
            sched = by_step[s]["schedule"]
            if r in sched["preempted_req_ids"]:
                lost = series.get(s - 1, 0)
                ax.annotate(f"preempted: blocks freed,\n{lost} computed tokens dropped", xy=(s, 0), xytext=(s, lost * 0.45),
                            ha="center", fontsize=8, color="tab:red", arrowprops=dict(arrowstyle="->", color="tab:red"))
            c = sched["scheduled_cached_reqs"]
            if r in c["req_ids"] and c["resumed_from_preemption"][c["req_ids"].index(r)]:
                ax.annotate(f"resumed: {sched['num_scheduled_tokens'][r]} tokens recomputed", xy=(s, series[s]),
                            xytext=(s - 0.3, series[s] + 3), ha="right", fontsize=8, color="tab:green",
                            arrowprops=dict(arrowstyle="->", color="tab:green"))
    ax.set(xlabel="engine step", ylabel="num_computed_tokens (after the step)")
    ax.set_ylim(bottom=0)
    ax.text(0.01, 0.98, "recompute (what vLLM V1 does): free the blocks, set num_computed_tokens = 0, prepend to "
            "WAITING, later rerun prefill\nswap (copy KV blocks to CPU and back) is what vLLM V1 does not do on "
            "this path: nothing in this run was swapped", transform=ax.transAxes, va="top", fontsize=9,
            bbox=dict(fc="white", ec=GREY))
    lines = ax.get_legend_handles_labels(); lines2 = ax2.get_legend_handles_labels()
    ax.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower right", fontsize=9)
    ax.set_title(f"Preemption by recompute: {trace.info['num_gpu_blocks']} blocks of {trace.info['block_size']} "
                 f"tokens, preempted: {', '.join('req ' + r for r in preempted) or 'none'}", fontsize=12)
    ax.set_ylim(top=ax.get_ylim()[1] * 1.35)
    return fig


def _cells(ax, y, values, owners, col, gid, fs):
    for x, (v, r) in enumerate(zip(values, owners)):
        ax.add_patch(Rectangle((x, y), 1, 0.8, fc=col[r], ec="black", alpha=0.75))
        ax.text(x + 0.5, y + 0.4, str(v), ha="center", va="center", fontsize=fs, gid=gid,
                rotation=90 if len(values) > 24 else 0)


def fig_packing(trace: Trace, step: int | None = None) -> plt.Figure:
    step = step or mixed_step(trace)
    b, col = steps(trace)[step]["execute"]["batch"], colors(trace)
    qsl, n = b["query_start_loc"], len(b["input_ids"])
    owners = [r for r, k in zip(b["req_ids"], b["num_scheduled_tokens"]) for _ in range(k)]
    fig, ax = _figure()
    fs = 8 if n <= 24 else 7
    for y, name in zip((2, 1, 0), ("input_ids", "positions", "slot_mapping")):
        _cells(ax, y, b[name], owners, col, name, fs)
        ax.text(-0.3, y + 0.4, name, ha="right", va="center", fontsize=10, family="monospace")
    for i, r in enumerate(b["req_ids"]):
        k = b["num_scheduled_tokens"][i]
        kind = f"prefill {k} tokens" if k > 1 else f"decode\npos {b['positions'][qsl[i]]}"
        ax.text((qsl[i] + qsl[i + 1]) / 2, 2.95 + 0.55 * (i % 2) * (k == 1), f"req {r}\n{kind}", ha="center",
                va="bottom", fontsize=8, color=col[r], weight="bold")
    for i, q in enumerate(qsl):
        ax.plot([q, q], [-0.3, 2.9], color="black", lw=2)
        ax.text(q, -0.35 - 0.3 * (i % 2), f"qsl[{i}]={q}", ha="center", va="top", fontsize=8)
    ax.set(xlim=(-2.6, n + 0.5), ylim=(-1.2, 4.3)); ax.axis("off")
    fig.subplots_adjust(left=0.02, right=0.98)
    ax.set_title(f"Packing step {step}: num_scheduled_tokens={b['num_scheduled_tokens']}, "
                 f"query_start_loc={qsl}", fontsize=12)
    return fig


def fig_forward_context(trace: Trace, step: int | None = None, num_layers: int | None = None) -> plt.Figure:
    step = step or mixed_step(trace)
    a = steps(trace)[step]["execute"]["attention"]
    fig, ax = _figure()
    ax.set(xlim=(0, 12), ylim=(0, 7)); ax.axis("off")
    _box(ax, 1.6, 3.5, f"GPUModelRunner\n.execute_model()\nstep {step}", w=2.6, h=1.2, fs=10)
    _box(ax, 5.1, 3.5, "forward_context\n\nattn_metadata:\n"
         f"  num_actual_tokens = {a['num_actual_tokens']}\n  max_query_len = {a['max_query_len']}\n"
         f"  max_seq_len = {a['max_seq_len']}\n  block_table {a['block_table_shape']}\n"
         f"slot_mapping [{a['slot_mapping_len']}]\nno_compile_layers[layer_name]\n  -> kv_cache {a['kv_cache_shape']}",
         w=3.6, h=4.4, fs=9, color="#fff3cd")
    _arrow(ax, (2.9, 3.5), (3.3, 3.5))
    ax.text(3.1, 3.7, "set_forward_context()", ha="center", fontsize=8, rotation=90, va="bottom")
    name = a["layer_name"]
    idx = [0, 1, None, num_layers - 1] if num_layers and num_layers > 3 else [0, None]
    ys = [6.0, 4.6, 3.3, 1.9] if len(idx) == 4 else [5.0, 2.6]
    for y, i in zip(ys, idx):
        if i is None:
            ax.text(9.3, y, f"... every Attention layer ({num_layers or '?'} in all) ...", ha="center", fontsize=9)
            continue
        layer = re.sub(r"\.\d+\.", f".{i}.", name, count=1)
        _box(ax, 9.3, y, f"{layer}\nAttention.forward(q, k, v)", w=3.6, h=0.9)
        _arrow(ax, (6.95, 3.5), (7.45, y), color="tab:blue")
    ax.text(9.3, 0.8, "each layer: get_attention_context(layer_name)\n-> (attn_metadata, layer, kv_cache, slot_mapping)"
            "\n-> self.impl.forward(...)  [" + trace.info["attention_backend"] + " backend]",
            ha="center", fontsize=9, color="tab:blue")
    ax.set_title("execute_model installs attn_metadata in forward_context; each attention layer pulls it by "
                 "layer_name", fontsize=12)
    return fig


def fig_slot_mapping(trace: Trace, step: int | None = None) -> plt.Figure:
    step = step or mixed_step(trace)
    ev, col, bs = steps(trace)[step], colors(trace), trace.info["block_size"]
    b, tables = ev["execute"]["batch"], ev["schedule"]["block_tables"]
    seq_lens = dict(zip(b["req_ids"], b["seq_lens"]))
    nblocks = min(trace.info["num_gpu_blocks"], max(max(t) for t in tables.values()) + 2)
    written = dict(zip(b["slot_mapping"], [r for r, k in zip(b["req_ids"], b["num_scheduled_tokens"]) for _ in range(k)]))
    fig, (ax, at) = _figure(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    for blk in range(nblocks):
        ax.text(-0.3, blk + 0.5, f"block {blk}", ha="right", va="center", fontsize=8)
        for off in range(bs):
            ax.add_patch(Rectangle((off, blk), 1, 1, fc=GREY if blk == 0 else "white", ec="#999999", lw=0.5))
    for r, table in tables.items():
        for pos in range(seq_lens[r]):
            slot = table[pos // bs] * bs + pos % bs
            w = slot in written
            ax.add_patch(Rectangle((slot % bs, slot // bs), 1, 1, fc=col[r], alpha=1 if w else 0.35,
                                   ec="black" if w else "#999999", lw=1.2 if w else 0.5, gid=f"write:{slot}" if w else None))
            if w:
                ax.text(slot % bs + 0.5, slot // bs + 0.5, str(slot), ha="center", va="center", fontsize=6)
    ax.text(bs / 2, 0.5, "block 0: reserved null block", ha="center", va="center", fontsize=8)
    used = {blk for t in tables.values() for blk in t}
    for blk in set(range(1, nblocks)) - used:
        ax.text(bs / 2, blk + 0.5, "free", ha="center", va="center", fontsize=8, color="#888888")
    ax.set(xlim=(-2.2, bs), ylim=(nblocks, 0), xticks=range(0, bs, 2), xlabel="slot offset in block (pos % block_size)")
    ax.set_yticks([]); ax.set_frame_on(False)
    ax.set_title(f"write: slot_mapping sends step {step}'s {len(written)} new tokens to slots\n"
                 f"(solid, numbered: written now; faded: KV already cached)", fontsize=10)
    rows = list(tables.items())
    for y, (r, table) in enumerate(rows):
        at.text(len(table) + 0.05, y + 0.5, f"req {r}", va="center", fontsize=9, color=col[r], weight="bold")
        for j, phys in enumerate(table):
            light = tuple(0.5 + 0.5 * c for c in col[r])  # opaque, so the arrows start under the cell
            at.add_patch(Rectangle((j, y + 0.1), 0.9, 0.8, fc=light, ec="black", gid=f"read:{r}:{j}"))
            at.text(j + 0.45, y + 0.5, f"L{j}->{phys}", ha="center", va="center", fontsize=8)
            at.add_artist(ConnectionPatch((j + 0.45, y + 0.5), (bs, phys + 0.5), "data", "data", axesA=at, axesB=ax,
                                          color=col[r], alpha=0.7, arrowstyle="->", zorder=0.5))
    width = max(len(t) for t in tables.values())
    at.set(xlim=(-1.2, max(width, 3)), ylim=(max(len(rows), nblocks * 0.6), -0.5)); at.axis("off")
    at.set_title("read: block_table rows, physical = block_table[logical]", fontsize=10)
    fig.suptitle(f"slot = block_table[pos // {bs}] * {bs} + pos % {bs}  (step {step}, block_size {bs})", fontsize=12)
    return fig


def fig_sampling_and_release(trace: Trace, step: int | None = None, decode=None) -> plt.Figure:
    step, decode = step or mixed_step(trace), decode or str
    by_step, col = steps(trace), colors(trace)
    ex = by_step[step]["execute"]; b = ex["batch"]
    owners = [r for r, k in zip(b["req_ids"], b["num_scheduled_tokens"]) for _ in range(k)]
    fig, (ax, ar) = _figure(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    n = len(owners)
    for i, r in enumerate(owners):
        sel = i in b["logits_indices"]
        ax.add_patch(Rectangle((0, i), 2, 0.9, fc=col[r], alpha=1 if sel else 0.25, ec="black" if sel else "none",
                               gid=f"row:{i}" if sel else None))
    ax.text(1, n + 0.3, "hidden_states\n[num_tokens, hidden]", ha="center", va="top", fontsize=9)
    k, qsl = len(b["req_ids"]), b["query_start_loc"]
    ax.add_patch(Rectangle((3.2, n * 0.3), 1.6, n * 0.4, fc=LIGHT, ec="black"))
    ax.text(4.0, n * 0.5, "lm_head\n-> logits\n[num_reqs,\nvocab]", ha="center", va="center", fontsize=8)
    for i, r in enumerate(b["req_ids"]):
        last, y = qsl[i + 1] - 1, n * (0.1 + 0.8 * i / (k - 1)) if k > 1 else n / 2
        tok = ex["sampled"].get(r)
        if last in b["logits_indices"]:
            ax.annotate("", xy=(3.2, n * 0.5), xytext=(2, last + 0.45), arrowprops=dict(arrowstyle="->", color=col[r]))
            ax.annotate("", xy=(5.3, y), xytext=(4.8, n * 0.5), arrowprops=dict(arrowstyle="->", color=col[r]))
            ax.text(2.1, last + 0.45, f"row {last}", fontsize=7, va="center")
        label = f"req {r}: {tok} {decode(tok)!r}" if tok is not None else f"req {r}: partial prefill, no sample"
        ax.text(5.4, y, label, fontsize=9, va="center", color=col[r], weight="bold")
    ax.set(xlim=(-0.2, 9), ylim=(n + 2.5, -0.8)); ax.axis("off")
    ax.set_title(f"step {step}: logits_indices {b['logits_indices']} -> sampled tokens", fontsize=10)
    rel = next((s for s in sorted(by_step) if by_step[s].get("update", {}).get("freed")), None)
    if rel is not None:
        up, sched = by_step[rel]["update"], by_step[rel]["schedule"]
        nxt = by_step.get(rel + 1, {}).get("schedule")
        states = [("after schedule()", sched["block_tables"], sched["num_free_blocks"]),
                  ("after update_from_output()", {r: t for r, t in sched["block_tables"].items() if r not in up["freed"]},
                   up["num_free_blocks"])]
        if nxt:
            states.append(("after next schedule()", nxt["block_tables"], nxt["num_free_blocks"]))
        top = min(trace.info["num_gpu_blocks"], max(max(t) for _, tb, _ in states for t in tb.values() if t) + 2)
        for y, (name, tb, free) in enumerate(states):
            owner = {blk: r for r, t in tb.items() for blk in t}
            ar.text(1, y * 1.8 - 0.1, f"{name} (step {rel if y < 2 else rel + 1}): {free} free", fontsize=8)
            for blk in range(1, top):
                r = owner.get(blk)
                freed = y == 1 and any(blk in f for f in up["freed"].values())
                ar.add_patch(Rectangle((blk, y * 1.8), 0.9, 0.8, fc=col[r] if r else "white",
                                       ec="black", hatch="//" if freed else None, gid=f"freed:{blk}" if freed else None))
                ar.text(blk + 0.45, y * 1.8 + 0.4, str(blk), ha="center", va="center", fontsize=7)
        done = ", ".join(f"req {r} finished ({o['finish_reason']}), blocks {up['freed'][r]} returned"
                         for r in up["freed"] for o in up["outputs"] if o["request_id"] == r)
        ar.set(xlim=(0.8, max(top, 8)), ylim=(len(states) * 1.8, -0.8)); ar.axis("off")
        ar.set_title(f"step {rel}: {done}\n(hatched: returned to the free queue)", fontsize=9)
    fig.suptitle("Sampling reads one hidden state per request; finished requests release their KV blocks", fontsize=12)
    return fig


def fig_timeline(trace: Trace) -> plt.Figure:
    by_step, col = steps(trace), colors(trace)
    xs = sorted(by_step)
    fig, (ax, ab) = _figure(2, 1, sharex=True)
    bottom = [0] * len(xs)
    for r in col:
        h = [by_step[s]["schedule"]["num_scheduled_tokens"].get(r, 0) for s in xs]
        ax.bar(xs, h, bottom=bottom, color=col[r], ec="black", lw=0.3, label=f"req {r}")
        bottom = [a + c for a, c in zip(bottom, h)]
        held = [len(by_step[s]["schedule"]["block_tables"][r]) if r in by_step[s]["schedule"]["block_tables"]
                else (0 if r in by_step[s]["schedule"]["preempted_req_ids"] else float("nan")) for s in xs]
        ab.plot(xs, held, ".-", color=col[r], label=f"req {r}")
        for s, v in zip(xs, held):
            if r in by_step[s]["schedule"]["preempted_req_ids"]:
                ab.plot(s, 0, "v", color="red", ms=10)
                ab.annotate(f"req {r} preempted", (s, 0), (s, 0.6), fontsize=8, color="red", ha="center")
            if any(o["request_id"] == r and o["finish_reason"] for o in by_step[s].get("update", {}).get("outputs", [])):
                ab.plot(s, v, "X", color=col[r], ms=10, mec="black")
    if trace.info["num_gpu_blocks"] <= 64:
        ab.step(xs, [by_step[s]["schedule"]["num_free_blocks"] for s in xs], where="mid", color=GREY, ls="--",
                label="free blocks")
    ax.set(ylabel="tokens scheduled"); ab.set(xlabel="engine step", ylabel="KV blocks held")
    ax.legend(fontsize=8, ncol=2); ab.legend(fontsize=8, ncol=2, loc="upper left")
    ab.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Step timeline: tokens scheduled per request (stacked) and blocks held (X: finished, v: preempted)",
                 fontsize=11)
    fig.tight_layout()
    return fig


# ---------------------------------------------------------------- command line
def collect_traces(model: str | None = None) -> dict[str, tuple[argparse.Namespace, Trace]]:
    """Run the traced engine (in-process) once per entry of RUNS."""
    from minivllm.tracing.cli import add_trace_arguments, run_trace
    from minivllm.tracing.render import make_console
    parser = argparse.ArgumentParser()
    add_trace_arguments(parser)
    out = {}
    for name, extra in RUNS.items():
        args = parser.parse_args(["--in-process", "--steps", "0", *extra] + (["--model", model] if model else []))
        out[name] = (args, run_trace(args, console=make_console(io.StringIO())))
    return out


def draw_all(runs, decode=None, num_layers=None) -> dict[str, plt.Figure]:
    d, budget, pool = runs["default"][1], runs["small_budget"], runs["small_pool"][1]
    return {"fig2_process_boundary.png": fig_process_boundary(d),
            "fig3_schedule_step.png": fig_schedule_step(budget[1], budget[0].max_num_batched_tokens),
            "fig4_preemption_recompute.png": fig_preemption(pool),
            "fig5_packing.png": fig_packing(d),
            "fig6_forward_context.png": fig_forward_context(d, num_layers=num_layers),
            "fig7_slot_mapping_vs_block_table.png": fig_slot_mapping(d),
            "fig8_sampling_and_release.png": fig_sampling_and_release(d, decode=decode),
            "timeline.png": fig_timeline(pool)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m minivllm.tracing.figures", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="figures", help="folder for the PNGs (default: %(default)s)")
    p.add_argument("--model", default=None, help="model folder or hub id (default: SmolLM2-135M)")
    args = p.parse_args(argv)
    from transformers import AutoTokenizer
    from minivllm.models.loader import load_config, resolve_model
    folder = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    figs = draw_all(collect_traces(args.model), decode=lambda t: tokenizer.decode([t]),
                    num_layers=load_config(folder).num_hidden_layers)
    out = Path(args.out); out.mkdir(parents=True, exist_ok=True)
    for name, fig in figs.items():
        fig.savefig(out / name, dpi=DPI, metadata={"Software": None})
        plt.close(fig)
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
