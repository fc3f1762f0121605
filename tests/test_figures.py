"""plots/: every figure is drawn from the run of the notebook that shows it, and the engine never imports matplotlib."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from matplotlib.figure import Figure
from matplotlib.patches import ConnectionPatch, Rectangle
from matplotlib.text import Text

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # plots/ is a top-level folder of the repository, not an installed package
    sys.path.insert(0, str(ROOT))

from plots import __main__ as cli  # noqa: E402
from plots import (fig2_process_boundary, fig3_schedule_step, fig4_preemption, fig5_packing,  # noqa: E402
                   fig6_forward_context, fig7_slot_mapping, fig8_sampling_and_release,
                   fig9_prefix_cache, timeline)
from plots.common import DPI, SIZE  # noqa: E402
from plots.runs import NOTEBOOK_RUNS, collect  # noqa: E402

MODULES = [fig2_process_boundary, fig3_schedule_step, fig4_preemption, fig5_packing, fig6_forward_context,
           fig7_slot_mapping, fig8_sampling_and_release, fig9_prefix_cache, timeline]


@pytest.fixture(scope="module")
def runs():
    """Every notebook's traced run and the article's packed batch, collected once for the module."""
    return collect()


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text)]


def gids(fig: Figure) -> list[str]:
    return [a.get_gid() for a in fig.findobj(lambda a: isinstance(a.get_gid(), str))]


def python(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_the_engine_package_never_imports_matplotlib():
    loaded = python("import sys, minivllm, minivllm.tracing, minivllm.entrypoints.cli.trace, minivllm.tracing.render\n"
                    "print([m for m in sys.modules if m.split('.')[0] == 'matplotlib'])")
    assert loaded.strip() == "[]"
    assert not [p for p in (ROOT / "minivllm").rglob("*.py") if "matplotlib" in p.read_text()]


def test_plots_leave_matplotlibs_global_backend_alone():
    out = python("import sys, matplotlib; import plots.__main__\n"
                 "print('matplotlib.pyplot' in sys.modules, matplotlib.rcParams._get_backend_or_none())")
    assert out.split() == ["False", "None"]  # no pyplot, no matplotlib.use(): Figure.savefig renders by itself
    pattern = r"import pyplot|matplotlib\.pyplot|\.use\("
    assert not [p for p in (ROOT / "plots").glob("*.py") if re.search(pattern, p.read_text())]


def test_each_figure_module_is_small_and_plots_is_not_installed_with_minivllm():
    for path in (ROOT / "plots").glob("*.py"):
        assert len(path.read_text().splitlines()) < 200, path.name
    from setuptools import find_packages
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = find_packages(ROOT, include=include)
    assert "minivllm.tracing" in packages and not [p for p in packages if p.split(".")[0] == "plots"]


def test_every_figure_has_the_fixed_size(runs):
    figs = cli.draw_all(runs)
    assert sorted(figs) == sorted(m.NAME for m in MODULES)
    assert all(tuple(f.get_size_inches()) == SIZE and f.dpi == DPI for f in figs.values())


def test_process_boundary_counts_come_from_notebook_01s_run(runs):
    trace = runs.traces["01_request_lifecycle"]
    joined = "\n".join(texts(fig2_process_boundary.draw(trace)))
    assert trace.multiprocess and "a child process" in joined
    assert f"requests submitted: {len(trace.of_kind('submit'))}" in joined
    assert f"EngineCoreOutputs received: {len(trace.of_kind('update'))}" in joined
    assert f"{trace.summary()['steps']} steps" in joined and "pid" not in joined.lower()


def test_schedule_step_bar_is_running_plus_admitted_plus_leftover(runs):
    trace = runs.traces["03_input_packing"]
    budget = NOTEBOOK_RUNS["03_input_packing"][0]["max_num_batched_tokens"]
    step = fig3_schedule_step.two_pass_step(trace)
    sched = trace.by_step()[step]["schedule"]
    running, admitted = fig3_schedule_step.split_budget(sched)
    assert running and admitted  # this step serves RUNNING and admits from WAITING
    fig = fig3_schedule_step.draw(trace, budget)
    widths = {c.get_label(): c.patches[0].get_width() for c in fig.axes[0].containers}
    assert widths == {**{f"req {r}": n for r, n in sched["num_scheduled_tokens"].items()},
                      "leftover": budget - sched["total_num_scheduled_tokens"]}
    assert f"step {step}" in " ".join(texts(fig)) and any(t.startswith("pass 1: RUNNING") for t in texts(fig))


def notebook_02_trace():
    """Run notebook 02's own cells (its imports, then its engine run) and return the trace they print."""
    cells = [c for c in json.loads((ROOT / "notebooks" / "02_scheduler.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    engine_cell = next(c for c in cells if "run_traced(llm" in "".join(c["source"]))
    namespace: dict = {}
    exec("".join(cells[0]["source"]), namespace)
    exec("".join(engine_cell["source"]), namespace)
    namespace["llm"].shutdown()
    printed = "".join("".join(o.get("text", "")) for o in engine_cell["outputs"])
    return namespace["trace"], printed


def test_fig4_preempts_and_resumes_at_the_steps_notebook_02_prints(runs, capsys):
    notebook, printed = notebook_02_trace()
    capsys.readouterr()
    r, out, back = fig4_preemption.victim(notebook)
    assert fig4_preemption.victim(runs.traces["02_scheduler"]) == (r, out, back)
    assert f"SchedulerOutput (step {back})" in printed and f"preempted_req_ids=[{r}]" in printed
    fig = fig4_preemption.draw(runs.traces["02_scheduler"])
    joined = " ".join(texts(fig))
    assert f"preempted at step {out}, resumed at step {back}" in joined
    assert "recompute" in joined and "swap" in joined and "V0" in joined
    recompute, swap = ({ln.get_label(): ln for ln in ax.lines} for ax in fig.axes[:2])
    xs, ys = recompute[f"req {r} num_computed_tokens"].get_data()
    assert [y for x, y in zip(xs, ys) if out <= x < back] == [0] * (back - out)  # recompute: progress dropped
    xs, ys = swap[f"req {r} num_computed_tokens"].get_data()
    kept = runs.traces["02_scheduler"].num_computed_tokens()[r][out - 1]
    assert [y for x, y in zip(xs, ys) if out <= x < back] == [kept] * (back - out)  # swap: progress kept


def test_trace_helpers_agree_with_what_the_engine_recorded(runs):
    trace = runs.traces["02_scheduler"]
    computed, by_step = trace.num_computed_tokens(), trace.by_step()
    for step, ev in by_step.items():
        tables = ev["schedule"]["block_tables"]
        assert trace.block_owners(step) == {b: r for r, blocks in tables.items() for b in blocks}
        cached = ev["schedule"]["scheduled_cached_reqs"]
        for r, nct, resumed in zip(cached["req_ids"], cached["num_computed_tokens"], cached["resumed_from_preemption"]):
            assert resumed or nct == computed[r][step - 1]  # the scheduler's own count, one step later
    for e in trace.of_kind("update"):
        assert all(trace.finished_at(r) == e["step"] for r in e["freed"])


def test_fig5_is_the_articles_a_b_c_example(runs):
    batch = runs.packing["batch"]
    assert batch["req_ids"] == ["A", "B", "C"] and batch["positions"] == [0, 1, 2, 3, 50, 30]
    assert batch["num_scheduled_tokens"] == [4, 1, 1] and batch["query_start_loc"] == [0, 4, 5, 6]
    fig = fig5_packing.draw(runs.packing)
    for name in fig5_packing.ROWS + ("logits_indices",):
        assert [t.get_text() for t in fig.findobj(Text) if t.get_gid() == name] == [str(v) for v in batch[name]]
    assert [t for t in texts(fig) if re.fullmatch(r"[ABC]\d", t)] == ["A0", "A1", "A2", "A3", "B0", "C0"]


def test_forward_context_shows_the_pulled_metadata(runs):
    trace = runs.traces["04_forward_context"]
    attention = trace.by_step()[1]["execute"]["attention"]
    joined = "\n".join(texts(fig6_forward_context.draw(trace, num_layers=runs.num_layers)))
    assert attention["layer_name"] in joined and f"model.layers.{runs.num_layers - 1}." in joined
    assert f"num_actual_tokens = {attention['num_actual_tokens']}" in joined
    assert f"kv_cache {attention['kv_cache_shape']}" in joined


def test_slot_mapping_writes_and_block_table_reads_with_no_arrow_behind_a_cell(runs):
    trace = runs.traces["05_paged_kv_cache"]
    step = fig7_slot_mapping.mixed_step(trace)
    ev = trace.by_step()[step]
    fig = fig7_slot_mapping.draw(trace)
    ids = gids(fig)
    assert sorted(int(g[6:]) for g in ids if g.startswith("write:")) == sorted(ev["execute"]["batch"]["slot_mapping"])
    cells = {a.get_gid(): a for a in fig.findobj(Rectangle) if str(a.get_gid()).startswith("read:")}
    assert len(cells) == sum(len(t) for t in ev["schedule"]["block_tables"].values())
    assert any(len(t) > 1 for t in ev["schedule"]["block_tables"].values())  # a request reads two blocks
    # one column of read cells, each arrow leaving its own cell's left edge: none can pass behind another cell
    assert len({c.get_x() for c in cells.values()}) == 1 and len({c.get_y() for c in cells.values()}) == len(cells)
    for arrow in fig.findobj(ConnectionPatch):
        cell = cells["read:" + arrow.get_gid().removeprefix("arrow:")]
        assert arrow.xy1 == (cell.get_x(), cell.get_y() + cell.get_height() / 2)


def test_sampling_rows_tokens_and_freed_blocks(runs):
    trace = runs.traces["06_sampling_and_reclamation"]
    ex = trace.by_step()[1]["execute"]
    fig = fig8_sampling_and_release.draw(trace, decode=lambda t: f"<{t}>")
    ids = gids(fig)
    assert sorted(int(g[4:]) for g in ids if g.startswith("row:")) == sorted(ex["batch"]["logits_indices"])
    for r, tok in ex["sampled"].items():
        assert f"req {r}: {tok} '<{tok}>'" in texts(fig)
    release = next(e for e in trace.of_kind("update") if e["freed"])
    assert sorted(int(g[6:]) for g in ids if g.startswith("freed:")) == sorted(
        b for blocks in release["freed"].values() for b in blocks)


def notebook_07_blocks():
    """Run notebook 07's cells up to B's admission (setup, block hashes, admission) and return, from its live
    KVCacheManager, every block A and B hold as (block_id, ref_cnt, short hash), and B's admission event."""
    cells = [c for c in json.loads((ROOT / "notebooks" / "07_prefix_caching.ipynb").read_text())["cells"]
             if c["cell_type"] == "code"]
    admission = next(i for i, c in enumerate(cells) if 'engine.add_request("B"' in "".join(c["source"]))
    namespace: dict = {}
    for cell in cells[:admission + 1]:
        exec("".join(cell["source"]), namespace)
    manager, short = namespace["manager"], namespace["short"]
    blocks = {r: [(b.block_id, b.ref_cnt, short(b.block_hash)) for b in manager.req_to_blocks[r]]
              for r in namespace["PROMPTS"]}
    admitted = namespace["trace"].of_kind("schedule")[1]["scheduled_new_reqs"][0]
    namespace["llm"].shutdown()
    return blocks, admitted


def test_fig9_shares_the_blocks_notebook_07s_engine_shares(runs, capsys):
    blocks, admitted = notebook_07_blocks()
    capsys.readouterr()
    shared = [b for b, ref, _ in blocks["A"] if ref == 2]
    assert shared == [b for b, _, _ in blocks["B"][:2]] and fig9_prefix_cache.shared_blocks(runs.prefix) == shared
    fig = fig9_prefix_cache.draw(runs.prefix)
    ids, joined = gids(fig), texts(fig)
    assert sorted(int(g[7:]) for g in ids if g.startswith("shared:")) == shared
    assert sorted(g for g in ids if g.startswith("own:")) == sorted(f"own:{t[-1][0]}" for t in blocks.values())
    for b, ref, short in blocks["A"][:2]:
        assert f"hash {short}" in joined and f"ref_cnt={ref}" in joined
    assert f"admitted:{admitted['req_id']}:{admitted['num_computed_tokens']}" in ids
    assert sorted(g for g in ids if g.startswith("arrow:")) == sorted(
        f"arrow:{r}:{j}" for r, t in blocks.items() for j in range(len(t)))


def test_timeline_bars_are_num_scheduled_tokens(runs):
    trace = runs.traces["06_sampling_and_reclamation"]
    fig = timeline.draw(trace)
    scheds = trace.of_kind("schedule")
    for c in fig.axes[0].containers:
        r = c.get_label().removeprefix("req ")
        assert [p.get_height() for p in c.patches] == [e["num_scheduled_tokens"].get(r, 0) for e in scheds]
    assert {ln.get_label() for ln in fig.axes[1].lines} >= {f"req {r}" for r in trace.num_prompt_tokens()}


def test_main_writes_all_pngs(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "collect", lambda model=None: runs)
    assert cli.main(["--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert names == sorted(m.NAME for m in MODULES)
    assert all((tmp_path / n).read_bytes().startswith(b"\x89PNG") for n in names)
    assert sorted(capsys.readouterr().out.split()) == [str(tmp_path / n) for n in names]


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["--help"])
    assert exc.value.code == 0 and "--out" in capsys.readouterr().out
