"""Benchmark results as data: one JSON file per run, under benchmarks/results/, shared by every benchmark script.

A result carries what a number needs to be read later: the machine (CPU model, the instruction-set flags the
kernels dispatch on, cores), the versions (python, torch, minivllm's git commit), the exact command, every
round's numbers, a summary, the date, and free-text notes (`--note "machine shared with other jobs"`).
`benchmarks/report.py` turns these files into the tables of docs/performance.md (`make perf-report`).

Every script takes `--results DIR` (default: benchmarks/results/) and `--no-save`.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DIR = ROOT / "benchmarks" / "results"
# the flags minivllm's CPU kernels (csrc/cpu/) and oneDNN dispatch on; the rest of /proc/cpuinfo is noise here
FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "avx512_fp16",
         "amx_tile", "amx_bf16", "amx_int8")
_SKIP = {"results", "no_save", "note"}
# the load when the script started (this module is imported first thing): how shared the machine was
_LOAD_AT_START = [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def add_arguments(parser) -> None:
    """The options every benchmark shares: where its JSON result goes, or that it is not saved."""
    parser.add_argument("--results", metavar="DIR", default=str(DEFAULT_DIR),
                        help="write this run's JSON result into DIR (default: benchmarks/results/)")
    parser.add_argument("--no-save", action="store_true", help="print only; write no JSON result")
    parser.add_argument("--note", action="append", default=[], metavar="TEXT",
                        help="a note stored with the result, e.g. 'machine shared with other jobs' (repeatable)")


def machine() -> dict:
    """This machine as the kernels see it: CPU model, the relevant flags, cores, memory."""
    info = {"cpu": platform.processor() or platform.machine(), "flags": [], "os": platform.system()}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and info["cpu"] in ("", platform.machine(), platform.processor()):
            info["cpu"] = value.strip()
        elif key.strip() == "flags" and not info["flags"]:
            have = set(value.split())
            info["flags"] = [f for f in FLAGS if f in have]
    info["logical_cpus"] = os.cpu_count()
    info["usable_cpus"] = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    try:
        mem = next(l for l in Path("/proc/meminfo").read_text().splitlines() if l.startswith("MemTotal"))
        info["memory_gb"] = round(int(mem.split()[1]) / 1e6, 1)
    except (OSError, StopIteration):
        pass
    if _LOAD_AT_START is not None:
        info["load_average_at_start"] = _LOAD_AT_START
        info["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return info


def versions() -> dict:
    """python, torch and minivllm's git commit (with '-dirty' if the work tree has changes)."""
    out = {"python": platform.python_version()}
    try:
        import torch
        out["torch"] = torch.__version__
    except ImportError:
        pass
    try:
        git = ["git", "-C", str(ROOT)]
        commit = subprocess.run(git + ["rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(git + ["status", "--porcelain", "--untracked-files=no"], capture_output=True,
                               text=True, timeout=10).stdout.strip()
        out["minivllm_commit"] = commit + ("-dirty" if dirty else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        out["minivllm_commit"] = "unknown"
    return out


def command(script: str, argv: list[str] | None = None) -> str:
    """The command line that reproduces this run, from the repository root."""
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", f"benchmarks/{Path(script).name}"] + [shlex.quote(str(a)) for a in args])


def _plain(value):
    """JSON-safe: floats rounded to 6 significant digits (noise beyond that), paths and dtypes as strings."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if type(value).__name__ == "Namespace":  # a nested workload's arguments (spec_decode.py's random workload)
        return {k: _plain(v) for k, v in sorted(vars(value).items()) if k not in _SKIP}
    return str(value)


def build(args, benchmark: str, script: str, rounds: list[dict], summary: dict | None = None,
          argv: list[str] | None = None) -> dict:
    """The result document (see the module docstring for the fields)."""
    config = {k: v for k, v in sorted(vars(args).items()) if k not in _SKIP and not k.startswith("_")}
    return _plain({
        "benchmark": benchmark, "source": "measured",
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": command(script, argv), "machine": machine(), "versions": versions(),
        "config": config, "rounds": rounds, "summary": summary or {}, "notes": list(getattr(args, "note", []))})


def save(args, benchmark: str, script: str, rounds: list[dict], summary: dict | None = None,
         argv: list[str] | None = None) -> Path | None:
    """Write the result to `args.results`/<benchmark>-<date>.json (nothing with --no-save); returns the path."""
    if getattr(args, "no_save", False):
        return None
    doc = build(args, benchmark, script, rounds, summary, argv)
    folder = Path(getattr(args, "results", DEFAULT_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    stamp = doc["date"].replace("-", "").replace(":", "")
    path = folder / f"{benchmark}-{stamp}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")  # rounds keep their columns' order
    print(f"result: {path}")
    return path
