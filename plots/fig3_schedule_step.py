"""Figure 3: one schedule() step, its token budget split between RUNNING (pass 1) and WAITING (pass 2).

Drawn from notebook 03's engine run (a 12-token budget, three requests), at the first step that both
serves RUNNING requests and admits a WAITING one; the queues before and after come from the same trace.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from minivllm.tracing import Trace
from plots.common import colors, new_figure

NAME = "fig3_schedule_step.png"


def split_budget(sched: dict) -> tuple[dict[str, int], dict[str, int]]:
    """(RUNNING tokens, WAITING-admitted tokens) of one SchedulerOutput, in scheduling order.

    A request resumed after preemption was admitted from WAITING, so it counts with the new ones.
    """
    nst, cached = sched["num_scheduled_tokens"], sched["scheduled_cached_reqs"]
    pairs = list(zip(cached["req_ids"], cached["resumed_from_preemption"]))
    running = {r: nst[r] for r, resumed in pairs if not resumed}
    admitted = {r: nst[r] for r, resumed in pairs if resumed}
    admitted.update({n["req_id"]: nst[n["req_id"]] for n in sched["scheduled_new_reqs"]})
    return running, admitted


def two_pass_step(trace: Trace) -> int:
    """The first step that serves RUNNING requests and also admits from WAITING (notebook 03's run: step 2)."""
    return next(e["step"] for e in trace.of_kind("schedule") if all(split_budget(e)))


def draw(trace: Trace, token_budget: int, step: int | None = None) -> Figure:
    step = step or two_pass_step(trace)
    by_step, plens = trace.by_step(), trace.num_prompt_tokens()
    sched, col = by_step[step]["schedule"], colors(plens)
    running, admitted = split_budget(sched)
    fig, (ax, aq) = new_figure(2, 1, gridspec_kw={"height_ratios": [1, 1.3]})
    cached = sched["scheduled_cached_reqs"]
    nct = {n["req_id"]: n["num_computed_tokens"] for n in sched["scheduled_new_reqs"]}
    nct.update(zip(cached["req_ids"], cached["num_computed_tokens"]))
    left = 0
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
    note = " (the last chunk was clamped: num_new_tokens = min(num_new_tokens, token_budget))" \
        if left == token_budget else ""
    ax.text(token_budget, -0.62, f"leftover {token_budget - left}{note}", ha="right", va="top", fontsize=9)
    ax.set(xlim=(0, token_budget), ylim=(-1, 1.1), yticks=[], xticks=range(token_budget + 1),
           xlabel="tokens of the step's budget")
    ax.set_title(f"One schedule() step (step {step}): token budget max_num_batched_tokens = {token_budget}",
                 fontsize=12)
    prev = by_step.get(step - 1, {}).get("update")
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
