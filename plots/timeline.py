"""The step timeline of notebook 06's run: tokens scheduled per request (stacked) and KV blocks held.

Preemptions are marked too, for a run that has them (`python -m minivllm trace --num-blocks 6`).
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from minivllm.tracing import Trace
from plots.common import GREY, colors, new_figure

NAME = "timeline.png"


def draw(trace: Trace) -> Figure:
    by_step, col = trace.by_step(), colors(trace.num_prompt_tokens())
    xs = sorted(by_step)
    fig, (ax, ab) = new_figure(2, 1, sharex=True)
    bottom = [0] * len(xs)
    for r in col:
        scheds = [by_step[s]["schedule"] for s in xs]
        h = [e["num_scheduled_tokens"].get(r, 0) for e in scheds]
        ax.bar(xs, h, bottom=bottom, color=col[r], ec="black", lw=0.3, label=f"req {r}")
        bottom = [a + c for a, c in zip(bottom, h)]
        held = [len(e["block_tables"][r]) if r in e["block_tables"] else
                (0 if r in e["preempted_req_ids"] else float("nan")) for e in scheds]
        ab.plot(xs, held, ".-", color=col[r], label=f"req {r}")
        for s in trace.preempted_at(r):
            ab.plot(s, 0, "v", color="red", ms=10)
            ab.annotate(f"req {r} preempted", (s, 0), (s, 0.6), fontsize=8, color="red", ha="center")
        if (done := trace.finished_at(r)) is not None:
            ab.plot(done, held[xs.index(done)], "X", color=col[r], ms=10, mec="black")
    if trace.info["num_gpu_blocks"] <= 64:
        ab.step(xs, [by_step[s]["schedule"]["num_free_blocks"] for s in xs], where="mid", color=GREY, ls="--",
                label="free blocks")
    ax.set(ylabel="tokens scheduled"); ab.set(xlabel="engine step", ylabel="KV blocks held")
    ax.legend(fontsize=8, ncol=2); ab.legend(fontsize=8, ncol=2, loc="upper left")
    ab.set_ylim(0, max(len(t) for e in trace.of_kind("schedule") for t in e["block_tables"].values()) + 1)
    ab.yaxis.set_major_locator(MaxNLocator(integer=True)); ab.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title("Step timeline: tokens scheduled per request (stacked) and blocks held (X: finished, v: preempted)",
                 fontsize=11)
    fig.tight_layout()
    return fig
