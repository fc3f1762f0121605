"""Figure 9: prefix caching. B's block_table starts with A's physical blocks, found by their hashes.

Drawn from notebook 07's run at B's admission step: the two block_table rows (from the trace's schedule
event), the physical blocks they point at with their ref_cnt and block hash (read from the live
KVCacheManager right after that step), and B's num_computed_tokens as the scheduler admitted it.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, FancyBboxPatch

from plots.common import GREY, NOTE, colors, new_figure

NAME = "fig9_prefix_cache.png"
PHYS_Y, ROW_Y, CELL_W, PHYS_W, DX = 3.75, {0: 5.9, 1: 1.6}, 1.5, 2.2, 2.6  # layout only


def shared_blocks(prefix: dict) -> list[int]:
    """The physical block ids every request's block_table holds at the admission step, in table order."""
    tables = prefix["trace"].by_step()[prefix["step"]]["schedule"]["block_tables"]
    first, *rest = tables.values()
    return [b for b in first if all(b in t for t in rest)]


def rect(ax, x, y, w, h, color, gid, lw=1.0):
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.04", fc=color, ec="black",
                                lw=lw, gid=gid))


def draw(prefix: dict) -> Figure:
    trace, step = prefix["trace"], prefix["step"]
    sched, bs = trace.by_step()[step]["schedule"], trace.info["block_size"]
    tables, col, shared = sched["block_tables"], colors(sched["block_tables"]), shared_blocks(prefix)
    admitted = {n["req_id"]: n for n in sched["scheduled_new_reqs"]}
    info = {bid: (ref, h) for blocks in prefix["blocks"].values() for bid, ref, h in blocks}
    phys = sorted({b for t in tables.values() for b in t}, key=lambda b: (b not in shared, b))
    px = {b: 1.6 + DX * i for i, b in enumerate(phys)}
    fig, ax = new_figure()
    for b in phys:
        ref, h = info[b]
        owner = [r for r, t in tables.items() if b in t]
        j = tables[owner[0]].index(b)
        rect(ax, px[b], PHYS_Y, PHYS_W, 1.6, NOTE if b in shared else tuple(0.55 + 0.45 * c for c in col[owner[0]]),
             f"shared:{b}" if b in shared else f"own:{b}", lw=2.2 if b in shared else 1.0)
        label = f"hash {h[:8]}" if h else "no hash (partial)"
        ax.text(px[b], PHYS_Y + 0.5, f"block {b}", ha="center", va="center", fontsize=10, weight="bold")
        ax.text(px[b], PHYS_Y + 0.17, f"ref_cnt={ref}", ha="center", va="center", fontsize=9,
                color="#b00000" if ref > 1 else "black", weight="bold" if ref > 1 else "normal")
        ax.text(px[b], PHYS_Y - 0.16, label, ha="center", va="center", fontsize=8, family="monospace")
        who = "shared: " + " + ".join(owner) if b in shared else f"{owner[0]}'s own"
        ax.text(px[b], PHYS_Y - 0.5, f"{who}, tokens {j * bs}-{(j + 1) * bs - 1}", ha="center", va="center",
                fontsize=7.5, color="#555555")
    for i, (r, table) in enumerate(tables.items()):
        y, up = ROW_Y[i], 1 if i == 0 else -1
        ax.text(0.5, y + 0.7 * up, f"block_table[{r}] = {table}", fontsize=10, color=col[r], weight="bold",
                va="center")
        for j, b in enumerate(table):
            x = 1.6 + DX * j
            rect(ax, x, y, CELL_W, 0.6, tuple(0.5 + 0.5 * c for c in col[r]), f"table:{r}:{j}")
            ax.text(x, y, f"L{j} -> {b}", ha="center", va="center", fontsize=9)
            ax.add_artist(ConnectionPatch((x, y - 0.3 * up), (px[b], PHYS_Y + 0.85 * up), "data", "data",
                                          color=col[r], arrowstyle="-|>", lw=1.4, gid=f"arrow:{r}:{j}"))
    for r, n in admitted.items():
        hit = n["num_computed_tokens"]
        note = (f"step {step}: {r} admitted with num_computed_tokens = {hit}\n"
                f"({hit // bs} blocks hit in cached_block_hash_to_block),\n"
                f"scheduled for the other {sched['num_scheduled_tokens'][r]} of {n['num_prompt_tokens']} "
                f"prompt tokens only")
        ax.text(11.9, 0.5, note, fontsize=9, ha="right", va="center", gid=f"admitted:{r}:{hit}",
                bbox=dict(boxstyle="round,pad=0.4", fc=NOTE, ec=GREY))
    ax.text(11.9, 6.75, f"hash = sha256(parent hash, {bs} token ids): one hash names\nthe whole prefix up to its"
            " block's end; a partial block has none", fontsize=9, ha="right", va="center",
            bbox=dict(boxstyle="round,pad=0.4", fc="white", ec=GREY))
    ax.set(xlim=(0, 12), ylim=(0, 7.1)); ax.axis("off")
    fig.suptitle(f"Prefix caching: {' and '.join(tables)} share physical blocks {shared} "
                 f"(ref_cnt {info[shared[0]][0]}), each keeps its own tail block  (step {step}, block_size {bs})", fontsize=12)
    return fig
