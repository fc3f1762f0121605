"""Figure 2: class ownership across the process boundary, with the counts of notebook 01's traced run."""
from __future__ import annotations

from matplotlib.figure import Figure

from minivllm.tracing import Trace
from plots.common import arrow, box, new_figure

NAME = "fig2_process_boundary.png"


def draw(trace: Trace) -> Figure:
    fig, ax = new_figure()
    ax.set(xlim=(0, 10), ylim=(0, 6.4)); ax.axis("off")
    n_req, n_steps, n_outs = len(trace.of_kind("submit")), len(trace.of_kind("update")), len(trace.of_kind("outputs"))
    s, info = trace.summary(), trace.info
    where = "a child process, as by default" if trace.multiprocess else "in the caller's process for this run"
    ax.text(0.1, 6.2, "caller process", fontsize=12, weight="bold", va="top")
    ax.text(0.1, 2.95, f"EngineCore process ({where})", fontsize=12, weight="bold", va="top")
    ax.axhline(3.25, color="black", ls="--", lw=1.5)
    ax.text(0.1, 3.32, "process boundary (IPC queues)", fontsize=9, style="italic")
    box(ax, 1.7, 4.5, "LLM\ngenerate()")
    box(ax, 5.0, 4.5, f"LLMEngine\nstep(): get_output() -> detokenize\nRequestOutput batches: {n_outs}", w=3.0, h=1.0)
    box(ax, 8.4, 4.5, "EngineCoreClient\n(input / output queues)")
    arrow(ax, (3.0, 4.5), (3.5, 4.5)); arrow(ax, (6.5, 4.5), (7.1, 4.5))
    ax.text(3.25, 4.75, "owns", ha="center", fontsize=8); ax.text(6.8, 4.75, "owns", ha="center", fontsize=8)
    box(ax, 5.0, 2.0, f"EngineCore  run_busy_loop()\n{n_steps} steps: schedule -> execute_model -> update_from_output",
        w=5.2)
    arrow(ax, (8.0, 4.05), (6.4, 2.45), f"requests submitted: {n_req}\n(EngineCoreRequest, input queue)",
          color="tab:blue", side=-1)
    arrow(ax, (7.0, 2.45), (8.8, 4.05), f"EngineCoreOutputs received: {n_steps}\n(one per step, output queue)",
          color="tab:red")
    children = [(1.7, f"Scheduler\nWAITING / RUNNING queues\npreemptions: {s['preemptions']}"),
                (5.0, f"KVCacheManager -> BlockPool\n{info['num_gpu_blocks']} blocks x {info['block_size']} tokens"
                      f"\npeak blocks in use: {s['peak_blocks']}"),
                (8.3, f"GPUModelRunner\n{info['attention_backend']} attention\ntokens run: {s['scheduled_tokens']}")]
    for x, text in children:
        box(ax, x, 0.6, text, w=3.0, h=1.0)
        arrow(ax, (5.0 + (x - 5.0) * 0.3, 1.55), (x, 1.15))
    ax.set_title("Class ownership across the process boundary (counts from notebook 01's traced run)", fontsize=13)
    return fig
