"""`python -m plots --out figures`: rerun the notebooks' traced engine runs and write every figure as a PNG."""
from __future__ import annotations

import argparse
from pathlib import Path

from matplotlib.figure import Figure

from plots import (fig2_process_boundary, fig3_schedule_step, fig4_preemption, fig5_packing, fig6_forward_context,
                   fig7_slot_mapping, fig8_sampling_and_release, fig9_prefix_cache, timeline)
from plots.common import DPI
from plots.runs import NOTEBOOK_RUNS, Runs, collect


def draw_all(runs: Runs) -> dict[str, Figure]:
    """{file name: Figure}, each drawn from the run of the notebook that shows it."""
    t = runs.traces
    budget = NOTEBOOK_RUNS["03_input_packing"][0]["max_num_batched_tokens"]
    return {fig2_process_boundary.NAME: fig2_process_boundary.draw(t["01_request_lifecycle"]),
            fig3_schedule_step.NAME: fig3_schedule_step.draw(t["03_input_packing"], budget),
            fig4_preemption.NAME: fig4_preemption.draw(t["02_scheduler"]),
            fig5_packing.NAME: fig5_packing.draw(runs.packing),
            fig6_forward_context.NAME: fig6_forward_context.draw(t["04_forward_context"], runs.num_layers),
            fig7_slot_mapping.NAME: fig7_slot_mapping.draw(t["05_paged_kv_cache"]),
            fig8_sampling_and_release.NAME: fig8_sampling_and_release.draw(t["06_sampling_and_reclamation"],
                                                                           runs.decode),
            fig9_prefix_cache.NAME: fig9_prefix_cache.draw(runs.prefix),
            timeline.NAME: timeline.draw(t["06_sampling_and_reclamation"])}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m plots", description=__doc__.split("\n")[0].split(": ", 1)[1])
    p.add_argument("--out", default="figures", help="folder for the PNGs (default: %(default)s)")
    p.add_argument("--model", default=None, help="model folder or hub id (default: SmolLM2-135M)")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name, fig in draw_all(collect(args.model)).items():
        fig.savefig(out / name, dpi=DPI, metadata={"Software": None})
        print(out / name)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
