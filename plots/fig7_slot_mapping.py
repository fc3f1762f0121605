"""Figure 7: writes go by slot (slot_mapping, per token), reads go by block (block_table, per logical block).

Drawn from notebook 05's run at the step it studies: the first that mixes a prefill chunk with a decode.
The block_table entries stand in one column, one row per (request, logical block), so every read arrow
leaves its own cell's left edge and crosses no other cell.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Rectangle

from minivllm.tracing import Trace
from plots.common import GREY, colors, new_figure

NAME = "fig7_slot_mapping_vs_block_table.png"


def mixed_step(trace: Trace) -> int:
    """The first step whose batch mixes a multi-token prefill chunk with a decode (notebook 05's pick)."""
    return next(e["step"] for e in trace.of_kind("execute")
                if max(e["batch"]["num_scheduled_tokens"]) > 1 and min(e["batch"]["num_scheduled_tokens"]) == 1)


def draw(trace: Trace, step: int | None = None) -> Figure:
    step = step or mixed_step(trace)
    ev, col, bs = trace.by_step()[step], colors(trace.num_prompt_tokens()), trace.info["block_size"]
    b, tables = ev["execute"]["batch"], ev["schedule"]["block_tables"]
    seq_lens = dict(zip(b["req_ids"], b["seq_lens"]))
    nblocks = min(trace.info["num_gpu_blocks"], max(trace.block_owners(step)) + 2)
    written = set(b["slot_mapping"])
    fig, (ax, at) = new_figure(1, 2, gridspec_kw={"width_ratios": [1.6, 1]})
    for blk in range(nblocks):
        ax.text(-0.3, blk + 0.5, f"block {blk}", ha="right", va="center", fontsize=8)
        for off in range(bs):
            ax.add_patch(Rectangle((off, blk), 1, 1, fc=GREY if blk == 0 else "white", ec="#999999", lw=0.5))
    for r, table in tables.items():
        for pos in range(seq_lens[r]):
            slot = table[pos // bs] * bs + pos % bs
            w = slot in written
            ax.add_patch(Rectangle((slot % bs, slot // bs), 1, 1, fc=col[r], alpha=1 if w else 0.35,
                                   lw=1.2 if w else 0.5, ec="black" if w else "#999999",
                                   gid=f"write:{slot}" if w else None))
            if w:
                ax.text(slot % bs + 0.5, slot // bs + 0.5, str(slot), ha="center", va="center", fontsize=6)
    ax.text(bs / 2, 0.5, "block 0: reserved null block", ha="center", va="center", fontsize=8)
    for blk in set(range(1, nblocks)) - set(trace.block_owners(step)):
        ax.text(bs / 2, blk + 0.5, "free", ha="center", va="center", fontsize=8, color="#888888")
    ax.set(xlim=(-2.2, bs), ylim=(nblocks, 0), xticks=range(0, bs, 2), xlabel="slot offset in block (pos % block_size)")
    ax.set_yticks([]); ax.set_frame_on(False)
    ax.set_title(f"write: slot_mapping sends step {step}'s {len(written)} new tokens to slots\n"
                 f"(solid, numbered: written now; faded: KV already cached)", fontsize=10)
    rows = [(r, j, phys) for r, table in tables.items() for j, phys in enumerate(table)]
    x0, y = 0.5, -0.8
    for r, j, phys in rows:
        if j == 0:  # a header per request: its whole block_table row
            y += 0.8
            at.text(x0, y + 0.35, f"block_table[{r}] = {tables[r]}", fontsize=9, color=col[r], weight="bold")
            y += 0.6
        light = tuple(0.5 + 0.5 * c for c in col[r])
        at.add_patch(Rectangle((x0, y), 1.6, 0.8, fc=light, ec="black", gid=f"read:{r}:{j}"))
        at.text(x0 + 0.8, y + 0.4, f"L{j} -> {phys}", ha="center", va="center", fontsize=9)
        at.text(x0 + 1.75, y + 0.4, f"logical block {j} of req {r}: positions [{j * bs}, {(j + 1) * bs})", va="center",
                fontsize=8, color="#555555")
        at.add_artist(ConnectionPatch((x0, y + 0.4), (bs, phys + 0.5), "data", "data", axesA=at, axesB=ax,
                                      color=col[r], arrowstyle="->", lw=1.2, gid=f"arrow:{r}:{j}"))
        y += 1.0
    at.set(xlim=(0, 6), ylim=(max(y, nblocks * 0.8), -0.5)); at.axis("off")
    at.set_title("read: physical = block_table[logical], one block at a time", fontsize=10)
    fig.suptitle(f"slot = block_table[pos // {bs}] * {bs} + pos % {bs}  (step {step}, block_size {bs})", fontsize=12)
    return fig
