"""Figure 5: the article's packing example, A prefilling 4 tokens while B and C decode at positions 50 and 30.

Drawn from the batch the engine's own GPUModelRunner packed in notebook 03 (`_prepare_inputs` on the
article's SchedulerOutput): every number in a cell is a value of input_ids, positions or slot_mapping.
"""
from __future__ import annotations

from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from plots.common import colors, new_figure

NAME = "fig5_packing.png"
ROWS = ("input_ids", "positions", "slot_mapping")


def draw(packing: dict) -> Figure:
    b, bs = packing["batch"], packing["block_size"]
    col, qsl, n = colors(b["req_ids"]), b["query_start_loc"], len(b["input_ids"])
    # token i of request r's chunk: "A0".."A3", "B0", "C0" as the article names them
    owners = [(r, i) for r, k in zip(b["req_ids"], b["num_scheduled_tokens"]) for i in range(k)]
    fig, ax = new_figure()
    for y, name in zip((2, 1, 0), ROWS):
        ax.text(-0.15, y + 0.4, name, ha="right", va="center", fontsize=11, family="monospace")
        for x, (value, (r, i)) in enumerate(zip(b[name], owners)):
            ax.add_patch(Rectangle((x, y), 1, 0.8, fc=col[r], ec="black", alpha=0.75))
            ax.text(x + 0.5, y + 0.4, str(value), ha="center", va="center", fontsize=11, gid=name)
            if name == "input_ids":
                ax.text(x + 0.5, y + 0.12, f"{r}{i}", ha="center", va="center", fontsize=8, style="italic")
    for i, r in enumerate(b["req_ids"]):
        k, start = b["num_scheduled_tokens"][i], qsl[i]
        kind = f"prefill chunk, {k} tokens" if k > 1 else f"decode\npos {b['positions'][start]}"
        ax.text((start + qsl[i + 1]) / 2, 2.95, f"{r}: {kind}\nseq_len {b['seq_lens'][i]}", ha="center",
                va="bottom", fontsize=9, color=col[r], weight="bold")
    for i, q in enumerate(qsl):
        ax.plot([q, q], [-0.2, 2.9], color="black", lw=2)
        ax.text(q, -0.25, f"qsl[{i}]={q}", ha="center", va="top", fontsize=9)
    ax.text(-0.15, -0.95, "logits_indices", ha="right", va="center", fontsize=11, family="monospace")
    for x in b["logits_indices"]:  # the one row per request whose hidden state reaches lm_head
        ax.annotate(str(x), xy=(x + 0.5, -0.05), xytext=(x + 0.5, -0.95), ha="center", va="center", fontsize=11,
                    gid="logits_indices", arrowprops=dict(arrowstyle="->", shrinkB=0))
    ax.text(n / 2, -1.5, f"slot_mapping[i] = block_table[pos // {bs}] * {bs} + pos % {bs};  block_table rows: "
            + ", ".join(f"{r}: {[x for x in row if x]}" for r, row in zip(b["req_ids"], b["block_table"])),  # 0 pads
            ha="center", va="center", fontsize=9)
    ax.set(xlim=(-2.6, n + 0.6), ylim=(-1.8, 4.0)); ax.axis("off")
    fig.subplots_adjust(left=0.02, right=0.98)
    ax.set_title(f"Packing one step: num_scheduled_tokens = {b['num_scheduled_tokens']}, "
                 f"query_start_loc = {qsl}", fontsize=12)
    return fig
