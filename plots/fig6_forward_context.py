"""Figure 6: execute_model installs attn_metadata in forward_context; each attention layer pulls it by name.

Drawn from notebook 04's run ("Once upon a time", one token): the metadata of its single step.
"""
from __future__ import annotations

import re

from matplotlib.figure import Figure

from minivllm.tracing import Trace
from plots.common import NOTE, arrow, box, new_figure

NAME = "fig6_forward_context.png"


def draw(trace: Trace, num_layers: int, step: int = 1) -> Figure:
    a = trace.by_step()[step]["execute"]["attention"]
    fig, ax = new_figure()
    ax.set(xlim=(0, 12), ylim=(0, 7)); ax.axis("off")
    box(ax, 1.6, 3.5, f"GPUModelRunner\n.execute_model()\nstep {step}", w=2.6, h=1.2, fs=10)
    box(ax, 5.1, 3.5, "forward_context\n\nattn_metadata:\n"
        f"  num_actual_tokens = {a['num_actual_tokens']}\n  max_query_len = {a['max_query_len']}\n"
        f"  max_seq_len = {a['max_seq_len']}\n  block_table {a['block_table_shape']}\n"
        f"slot_mapping [{a['slot_mapping_len']}]\nno_compile_layers[layer_name]\n  -> kv_cache {a['kv_cache_shape']}",
        w=3.6, h=4.4, fs=9, color=NOTE)
    arrow(ax, (2.9, 3.5), (3.3, 3.5))
    ax.text(3.1, 3.7, "set_forward_context()", ha="center", fontsize=8, rotation=90, va="bottom")
    for y, i in zip([6.0, 4.6, 3.3, 1.9], [0, 1, None, num_layers - 1]):
        if i is None:
            ax.text(9.3, y, f"... every Attention layer ({num_layers} in all) ...", ha="center", fontsize=9)
            continue
        layer = re.sub(r"\.\d+\.", f".{i}.", a["layer_name"], count=1)  # model.layers.0.self_attn.attn -> .29.
        box(ax, 9.3, y, f"{layer}\nAttention.forward(q, k, v)", w=3.6, h=0.9)
        arrow(ax, (6.95, 3.5), (7.45, y), color="tab:blue")
    ax.text(9.3, 0.8, "each layer: get_attention_context(layer_name)\n-> (attn_metadata, layer, kv_cache, slot_mapping)"
            "\n-> self.impl.forward(...)  [" + trace.info["attention_backend"] + " backend]",
            ha="center", fontsize=9, color="tab:blue")
    ax.set_title("execute_model installs attn_metadata in forward_context; each attention layer pulls it by "
                 "layer_name", fontsize=12)
    return fig
