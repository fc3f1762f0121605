"""What every figure shares: size, colours, and the two shapes (a labelled box, a labelled arrow).

Figures are `matplotlib.figure.Figure` objects drawn without pyplot, so nothing here selects or changes
matplotlib's global backend: `Figure.savefig` renders PNGs through Agg on its own.
"""
from __future__ import annotations

import matplotlib
from matplotlib.figure import Figure
from matplotlib.patches import FancyBboxPatch

SIZE, DPI = (12, 6.5), 110
GREY, LIGHT, NOTE = "#bbbbbb", "#eeeeee", "#fff3cd"


def new_figure(nrows: int = 1, ncols: int = 1, **subplot_kw) -> tuple[Figure, object]:
    """A fixed-size Figure and its axes (one Axes, or an array of them), as `plt.subplots` would give."""
    fig = Figure(figsize=SIZE, dpi=DPI)
    return fig, fig.subplots(nrows, ncols, **subplot_kw)


def colors(request_ids) -> dict[str, tuple]:
    """One tab10 colour per request id, in the order given: ["0", "1"] -> {"0": blue, "1": orange}."""
    palette = matplotlib.colormaps["tab10"].colors
    return {r: palette[i % len(palette)] for i, r in enumerate(request_ids)}


def box(ax, x, y, text, color=LIGHT, w=2.6, h=0.8, fs=9, **kw) -> None:
    """A rounded box of width w and height h centred on (x, y), with its text in the middle."""
    ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.05", fc=color, ec="black", **kw))
    ax.text(x, y, text, ha="center", va="center", fontsize=fs)


def arrow(ax, xy_from, xy_to, text="", color="black", fs=8, side=1) -> None:
    """An arrow; its text sits beside the midpoint, right of it (side=1) or left of it (side=-1)."""
    ax.annotate("", xy=xy_to, xytext=xy_from, arrowprops=dict(arrowstyle="-|>", color=color, lw=1.3))
    if text:
        ax.text((xy_from[0] + xy_to[0]) / 2 + 0.3 * side, (xy_from[1] + xy_to[1]) / 2, text, fontsize=fs,
                color=color, ha="left" if side > 0 else "right", va="center")
