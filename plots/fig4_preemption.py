"""Figure 4: the two preemption strategies side by side, on notebook 02's run (6 blocks of 8 tokens).

Left, recompute, as the engine ran it (vLLM V1's path): the victim's blocks are freed, num_computed_tokens
drops to 0, and on resuming it prefills again whatever the prefix cache no longer holds. Right, swap, the
path vLLM V0 had and V1 does not take: a sketch with the same run's numbers (the blocks the victim held,
its progress, the steps it waited), where the KV blocks go to CPU memory and come back, so only the next
token is scheduled.
"""
from __future__ import annotations

from matplotlib.figure import Figure

from minivllm.tracing import Trace
from plots.common import GREY, NOTE, colors, new_figure

NAME = "fig4_preemption_recompute.png"


def victim(trace: Trace) -> tuple[str, int, int]:
    """(request id, step preempted, step resumed) of the first preemption that the run resumed."""
    return next((r, trace.preempted_at(r)[0], trace.resumed_at(r)[0])
                for r in trace.num_prompt_tokens() if trace.preempted_at(r) and trace.resumed_at(r))


def draw(trace: Trace) -> Figure:
    r, out, back = victim(trace)
    by_step, series = trace.by_step(), trace.num_computed_tokens()[r]
    xs, color = sorted(series), colors(trace.num_prompt_tokens())[r]
    kept = series[out - 1]  # progress (tokens with KV in the cache) when it was preempted
    blocks = by_step[out - 1]["schedule"]["block_tables"][r]
    redo = by_step[back]["schedule"]["num_scheduled_tokens"][r]
    resumed = by_step[back]["schedule"]["scheduled_cached_reqs"]
    hit = resumed["num_computed_tokens"][resumed["req_ids"].index(r)]  # tokens a prefix-cache hit gave back
    swapped = {s: kept if out <= s < back else v for s, v in series.items()}
    fig, (ar, asw) = new_figure(1, 2, sharey=True)
    ar.plot(xs, [series[s] for s in xs], "o-", color=color, label=f"req {r} num_computed_tokens")
    asw.plot(xs, [swapped[s] for s in xs], "o-", color=color, label=f"req {r} num_computed_tokens")
    asw.plot([s for s in xs if out <= s < back], [kept] * (back - out), "s", ms=9, mfc="white", mec=color,
             label="KV held in CPU memory")
    top = max(series.values()) * 1.9
    ar.annotate(f"step {out}: preempted,\nblocks {blocks} freed,\n{kept} computed tokens dropped", xy=(out, 0),
                xytext=(out, kept * 0.5), ha="center", fontsize=8, color="tab:red",
                arrowprops=dict(arrowstyle="->", color="tab:red"))
    again = f"{redo} tokens prefilled again" + (f"\n({hit} found in the prefix cache)" if hit else "")
    ar.annotate(f"step {back}: resumed,\n{again}", xy=(back, series[back]),
                xytext=(back - 0.5, series[back] * 1.35), ha="right", fontsize=8, color="tab:green",
                arrowprops=dict(arrowstyle="->", color="tab:green"))
    asw.annotate(f"step {out}: swap out\nblocks {blocks} GPU -> CPU\n({len(blocks)} x {trace.info['block_size']}"
                 " slots over PCIe)", xy=(out, kept), xytext=(out, kept * 0.35), ha="center", fontsize=8,
                 color="tab:red", arrowprops=dict(arrowstyle="->", color="tab:red"))
    asw.annotate(f"step {back}: swap in {len(blocks)} blocks,\n1 token scheduled (not {redo})",
                 xy=(back, series[back]), xytext=(back - 0.5, series[back] * 1.35), ha="right", fontsize=8,
                 color="tab:green", arrowprops=dict(arrowstyle="->", color="tab:green"))
    notes = [(ar, "recompute: what vLLM V1 does (this traced run)",
              "free the blocks, num_computed_tokens = 0, prepend to WAITING;\ncost: GPU work to rebuild the KV"),
             (asw, "swap: vLLM V0's path, not V1's (sketched with this run's numbers)",
              "copy the KV blocks to host memory and back, keep the progress;\n"
              "cost: host memory and PCIe bandwidth")]
    for ax, title, text in notes:
        ax.set_title(title, fontsize=11)
        ax.text(0.02, 0.97, text, transform=ax.transAxes, va="top", fontsize=8.5, bbox=dict(fc=NOTE, ec=GREY))
        ax.axvspan(out - 0.5, back - 0.5, color=GREY, alpha=0.25, lw=0)
        ax.text((out + back - 1) / 2, top * 0.62, f"req {r} waits\nsteps {out}-{back - 1}", ha="center",
                fontsize=8, color="#555555")
        ax.set(xlabel="engine step", ylim=(0, top), xticks=xs[::2])
        ax.legend(loc="upper right", bbox_to_anchor=(1, 0.86), fontsize=8)
    ar.set_ylabel("num_computed_tokens (after the step)")
    fig.suptitle(f"Preemption in notebook 02's run ({trace.info['num_gpu_blocks']} blocks of "
                 f"{trace.info['block_size']} tokens): req {r} preempted at step {out}, resumed at step {back}",
                 fontsize=12)
    return fig
