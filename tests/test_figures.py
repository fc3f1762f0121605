"""minivllm.tracing.figures: every figure is drawn from the trace it is given, and `main` writes all eight PNGs."""
from __future__ import annotations

import re

import matplotlib
import matplotlib.pyplot
import pytest
from matplotlib.figure import Figure
from matplotlib.text import Text

from minivllm.tracing import figures as F


@pytest.fixture(scope="module")
def runs():
    """The three traced runs main() draws from (default, 4-token budget, 6-block pool), run once for the module."""
    return F.collect_traces()


@pytest.fixture(autouse=True)
def close_figures():
    yield
    matplotlib.pyplot.close("all")


def texts(fig: Figure) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text)]


def step_of(fig: Figure) -> int:
    return int(re.search(r"step (\d+)", " ".join(texts(fig))).group(1))


def test_backend_is_agg_and_figures_are_fixed_size(runs):
    fig = F.fig_timeline(runs["default"][1])
    assert matplotlib.get_backend().lower() == "agg"
    assert tuple(fig.get_size_inches()) == F.SIZE and fig.dpi == F.DPI


def test_process_boundary_counts_come_from_the_trace(runs):
    trace = runs["default"][1]
    fig = F.fig_process_boundary(trace)
    joined = "\n".join(texts(fig))
    assert f"{len(trace.of_kind('submit'))} requests submitted" in joined
    assert f"{len(trace.of_kind('update'))} EngineCoreOutputs" in joined
    assert f"{trace.summary()['steps']} steps" in joined
    assert "caller process" in joined and "EngineCore process" in joined and "pid" not in joined.lower()


def test_schedule_step_bar_is_running_plus_admitted_plus_leftover(runs):
    args, trace = runs["small_budget"]
    fig = F.fig_schedule_step(trace, args.max_num_batched_tokens)
    sched = F.steps(trace)[step_of(fig)]["schedule"]
    running, admitted = F.split_budget(sched)
    assert running and admitted  # this step serves RUNNING and admits from WAITING
    widths = {c.get_label(): c.patches[0].get_width() for c in fig.axes[0].containers}
    assert widths == {**{f"req {r}": n for r, n in sched["num_scheduled_tokens"].items()},
                      "leftover": args.max_num_batched_tokens - sched["total_num_scheduled_tokens"]}
    assert any(t.startswith("pass 1: RUNNING") for t in texts(fig))


def test_preempted_curve_drops_to_zero_at_a_preemption_step(runs):
    trace = runs["small_pool"][1]
    by_step = F.steps(trace)
    preempted = {r for e in trace.of_kind("schedule") for r in e["preempted_req_ids"]}
    assert preempted, "the small pool must preempt"
    fig = F.fig_preemption(trace)
    lines = {ln.get_label(): ln for ln in fig.axes[0].lines}
    for r in preempted:
        xs, ys = lines[f"req {r} num_computed_tokens"].get_data()
        drops = [int(x) for x, y, prev in zip(xs[1:], ys[1:], ys[:-1]) if y == 0 and prev > 0]
        assert drops and all(r in by_step[s]["schedule"]["preempted_req_ids"] for s in drops)
    joined = " ".join(texts(fig))
    assert "preempted" in joined and "resumed" in joined and "swap" in joined


def test_packing_cells_are_the_batch_arrays(runs):
    trace = runs["default"][1]
    step = F.mixed_step(trace)
    batch = F.steps(trace)[step]["execute"]["batch"]
    assert max(batch["num_scheduled_tokens"]) > 1 and min(batch["num_scheduled_tokens"]) == 1
    fig = F.fig_packing(trace, step)
    for name in ("input_ids", "positions", "slot_mapping"):
        assert [t.get_text() for t in fig.findobj(Text) if t.get_gid() == name] == [str(v) for v in batch[name]]
    assert f"query_start_loc={batch['query_start_loc']}" in " ".join(texts(fig))


def test_forward_context_shows_the_pulled_metadata(runs):
    trace = runs["default"][1]
    attention = F.steps(trace)[F.mixed_step(trace)]["execute"]["attention"]
    joined = "\n".join(texts(F.fig_forward_context(trace, num_layers=30)))
    assert attention["layer_name"] in joined and "model.layers.29." in joined
    assert f"num_actual_tokens = {attention['num_actual_tokens']}" in joined
    assert f"kv_cache {attention['kv_cache_shape']}" in joined


def test_slot_mapping_writes_and_block_table_reads(runs):
    trace = runs["default"][1]
    ev = F.steps(trace)[F.mixed_step(trace)]
    fig = F.fig_slot_mapping(trace)
    gids = [a.get_gid() for a in fig.findobj(lambda a: isinstance(a.get_gid(), str))]
    assert sorted(int(g[6:]) for g in gids if g.startswith("write:")) == sorted(ev["execute"]["batch"]["slot_mapping"])
    assert sum(g.startswith("read:") for g in gids) == sum(len(t) for t in ev["schedule"]["block_tables"].values())


def test_sampling_rows_tokens_and_freed_blocks(runs):
    trace = runs["default"][1]
    ex = F.steps(trace)[F.mixed_step(trace)]["execute"]
    fig = F.fig_sampling_and_release(trace, decode=lambda t: f"<{t}>")
    gids = [a.get_gid() for a in fig.findobj(lambda a: isinstance(a.get_gid(), str))]
    assert sorted(int(g[4:]) for g in gids if g.startswith("row:")) == sorted(ex["batch"]["logits_indices"])
    for r, tok in ex["sampled"].items():
        assert f"req {r}: {tok} '<{tok}>'" in texts(fig)
    release = next(e for e in trace.of_kind("update") if e["freed"])
    assert sorted(int(g[6:]) for g in gids if g.startswith("freed:")) == sorted(
        b for blocks in release["freed"].values() for b in blocks)


def test_timeline_bars_are_num_scheduled_tokens(runs):
    trace = runs["small_pool"][1]
    fig = F.fig_timeline(trace)
    scheds = trace.of_kind("schedule")
    for c in fig.axes[0].containers:
        r = c.get_label().removeprefix("req ")
        assert [p.get_height() for p in c.patches] == [e["num_scheduled_tokens"].get(r, 0) for e in scheds]
    assert {ln.get_label() for ln in fig.axes[1].lines} >= {f"req {r}" for r in F.colors(trace)}


def test_main_writes_all_pngs(runs, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(F, "collect_traces", lambda model=None: runs)
    assert F.main(["--out", str(tmp_path)]) == 0
    names = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(names) == 8 and "timeline.png" in names and names[0].startswith("fig2_")
    assert all((tmp_path / n).read_bytes().startswith(b"\x89PNG") for n in names)
    assert sorted(capsys.readouterr().out.split()) == [str(tmp_path / n) for n in names]


def test_help_exits_cleanly(capsys):
    with pytest.raises(SystemExit) as exc:
        F.main(["--help"])
    assert exc.value.code == 0 and "--out" in capsys.readouterr().out
