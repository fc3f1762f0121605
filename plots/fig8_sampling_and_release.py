"""Figure 8: logits_indices keeps one hidden state per request; a finished request's blocks go back to the pool.

Drawn from notebook 06's run: the left panel is its first step (two prompts prefilled, only their last
rows reach lm_head), the right panel the step where the first request finished and released its blocks.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from minivllm.tracing import Trace
from plots.common import LIGHT, colors, new_figure

NAME = "fig8_sampling_and_release.png"


def _sampling(ax, trace: Trace, step: int, decode, col) -> None:
    ex = trace.by_step()[step]["execute"]
    b, qsl = ex["batch"], ex["batch"]["query_start_loc"]
    owners = [r for r, k in zip(b["req_ids"], b["num_scheduled_tokens"]) for _ in range(k)]
    n, k = len(owners), len(b["req_ids"])
    for i, r in enumerate(owners):
        sel = i in b["logits_indices"]
        ax.add_patch(Rectangle((0, i), 2, 0.9, fc=col[r], alpha=1 if sel else 0.25, ec="black" if sel else "none",
                               gid=f"row:{i}" if sel else None))
    ax.text(1, n + 0.3, "hidden_states\n[num_tokens, hidden]", ha="center", va="top", fontsize=9)
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


def _release(ax, trace: Trace, step: int, col) -> None:
    by_step = trace.by_step()
    up, owners = by_step[step]["update"], trace.block_owners(step)
    freed = {blk for blocks in up["freed"].values() for blk in blocks}
    states = [(f"after schedule() (step {step})", owners, by_step[step]["schedule"]["num_free_blocks"]),
              (f"after update_from_output() (step {step})", {k: r for k, r in owners.items() if k not in freed},
               up["num_free_blocks"])]
    if step + 1 in by_step:
        states.append((f"after next schedule() (step {step + 1})", trace.block_owners(step + 1),
                       by_step[step + 1]["schedule"]["num_free_blocks"]))
    top = min(trace.info["num_gpu_blocks"], max(max(o, default=0) for _, o, _ in states) + 2)
    for y, (name, owner, free) in enumerate(states):
        ax.text(1, y * 1.8 - 0.1, f"{name}: {free} free", fontsize=8)
        for blk in range(1, top):
            r, hatched = owner.get(blk), y == 1 and blk in freed
            ax.add_patch(Rectangle((blk, y * 1.8), 0.9, 0.8, fc=col[r] if r else "white", ec="black",
                                   hatch="//" if hatched else None, gid=f"freed:{blk}" if hatched else None))
            ax.text(blk + 0.45, y * 1.8 + 0.4, str(blk), ha="center", va="center", fontsize=7)
    done = ", ".join(f"req {o['request_id']} finished ({o['finish_reason']}), blocks {up['freed'][o['request_id']]}"
                     " returned" for o in up["outputs"] if o["request_id"] in up["freed"])
    ax.set(xlim=(0.8, max(top, 8)), ylim=(len(states) * 1.8, -0.8)); ax.axis("off")
    ax.set_title(f"step {step}: {done}\n(hatched: returned to the free queue)", fontsize=9)


def draw(trace: Trace, decode=str, step: int = 1) -> Figure:
    col = colors(trace.num_prompt_tokens())
    release = min(s for s in map(trace.finished_at, col) if s is not None)
    fig, (ax, ar) = new_figure(1, 2, gridspec_kw={"width_ratios": [1.25, 1]})
    _sampling(ax, trace, step, decode, col)
    _release(ar, trace, release, col)
    fig.suptitle("Sampling reads one hidden state per request; finished requests release their KV blocks", fontsize=12)
    return fig
