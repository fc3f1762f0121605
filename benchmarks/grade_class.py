"""Grading a class at scale: `python -m minivllm.labs grade` on a made-up class, timed end to end.

The class: --students folders, each holding a copy of every lab's reference solution as a student would hand it
in (exercises/labNN_*.py), except the last, which holds nothing (every lab "missing"). Every reference passes
every check, hidden tests included, so this is the costly case: no check stops early. The grader runs as an
instructor runs it, one command over the whole folder, in a fresh process, with the reference observations
computed first unless the cache already holds them (--fresh-reference recomputes them inside the timing).
Printed: the whole run's wall time, the seconds the CSV gives each lab (summed over the class, and the slowest
student), and whether every graded row scored 1.00 and the empty student's rows say "missing".

    python benchmarks/grade_class.py                         # 30 students x 14 labs
    python benchmarks/grade_class.py --students 2 --labs 7   # a smoke test
"""
from __future__ import annotations

import argparse
import csv
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import results  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--students", type=int, default=30, help="students in the class, the last with no files (default: 30)")
    p.add_argument("--labs", default=None, help="comma-separated lab numbers (default: every lab)")
    p.add_argument("--fresh-reference", action="store_true",
                   help="recompute the reference observations inside the timed run (default: the cache's, if any)")
    results.add_arguments(p)
    args = p.parse_args(argv)
    if args.students < 2:
        p.error("--students must be at least 2 (the last one hands in nothing)")
    return args


def make_class(root: Path, students: int) -> None:
    from minivllm.labs.grader import EXERCISES
    for i in range(1, students + 1):
        folder = root / f"student{i:02d}" / "exercises"
        if i < students:
            shutil.copytree(EXERCISES, folder, ignore=shutil.ignore_patterns("__*"))
        else:
            folder.mkdir(parents=True)


def main(argv=None) -> int:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "class"
        make_class(root, args.students)
        cmd = [sys.executable, "-m", "minivllm.labs", "grade", str(root), "--csv", str(Path(tmp) / "grades.csv")]
        cmd += ["--labs", args.labs] if args.labs else []
        cmd += ["--fresh-reference"] if args.fresh_reference else []
        t = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        wall = time.perf_counter() - t
        if proc.returncode != 0:
            print(proc.stdout[-3000:], proc.stderr[-3000:])
            return 1
        rows = list(csv.DictReader(open(Path(tmp) / "grades.csv")))
    per_lab, per_student = defaultdict(float), defaultdict(float)
    for r in rows:
        per_lab[int(r["lab"])] += float(r["seconds"])
        per_student[r["student"]] += float(r["seconds"])
    last = f"student{args.students:02d}"
    right = all((r["status"], r["score"]) == (("missing", "0.00") if r["student"] == last else ("graded", "1.00"))
                for r in rows)
    labs = sorted(per_lab)
    print(f"{args.students} students x {len(labs)} labs: {wall:.0f} s wall ({wall / 60:.1f} min), "
          f"{len(rows)} CSV rows, every row as expected: {right}")
    print(f"slowest student {max(per_student.values()):.0f} s; seconds per lab, summed over the class:")
    print("  " + "  ".join(f"lab {n}: {per_lab[n]:.0f}" for n in labs))
    rounds = [{"lab": n, "seconds, whole class": round(per_lab[n], 1)} for n in labs]
    results.save(args, "grade_class", __file__, rounds,
                 {"students": args.students, "labs": len(labs), "wall s": round(wall, 1),
                  "wall min": round(wall / 60, 2), "slowest student s": round(max(per_student.values()), 1),
                  "every row as expected": right}, argv)
    return 0 if right else 1


if __name__ == "__main__":
    sys.exit(main())
