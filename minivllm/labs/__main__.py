"""`python -m minivllm.labs`: list the labs, write the handout or the student edition, check one lab, grade a class."""
from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from pathlib import Path


def main(argv=None) -> int:
    try:
        from minivllm.labs.faults import FAULTS
    except ImportError:  # a student edition (release.py) has no faults
        FAULTS = {}
    from minivllm.labs.registry import LABS
    parser = argparse.ArgumentParser(prog="python -m minivllm.labs", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    p_list = sub.add_parser("list", help="name every lab")
    p_list.add_argument("--json", action="store_true", help='print {"labs": [...]} (with --faults, "faults" too)')
    p_list.add_argument("--faults", action="store_true", help="instructors: also the common mistakes (faults) "
                        "each lab's checks must catch; not for students")
    p_student = sub.add_parser("student", help="write the handout: a page per lab, stubs (no solutions, no hidden "
                               "tests), notebooks without answers")
    p_student.add_argument("dir", help="folder to write README.md, labs/, exercises/ and notebooks/ into")
    p_release = sub.add_parser("release", help="instructors: write the student edition (the engine without the "
                               "answers, the handout; pip-installable) into a new folder")
    p_release.add_argument("dir")
    p_check = sub.add_parser("check", help="grade one lab (our reference when no submission is given)")
    p_check.add_argument("n", type=int, help=f"lab number: one of {sorted(LABS)}")
    p_check.add_argument("--submission", help="a student's exercise file, or a folder holding it")
    p_check.add_argument("--inject", metavar="FAULT", help="instructors: switch a named fault on (`list --faults` "
                         "names them)")
    p_check.add_argument("--all", action="store_true", help="run every check (default: stop at the first failure)")
    _bounds(p_check)
    p_grade = sub.add_parser("grade", help="grade a class: one subfolder per student, one CSV row per student and lab")
    p_grade.add_argument("submissions_dir")
    p_grade.add_argument("--csv", required=True, help="the CSV file to write")
    p_grade.add_argument("--labs", help="comma-separated lab numbers (default: every lab)")
    p_grade.add_argument("--feedback", metavar="DIR", help="folder for one feedback file per student, every "
                         "check's verdict (default: <csv name>_feedback/ beside the CSV)")
    _bounds(p_grade)
    args = parser.parse_args(argv)

    if args.command == "list":
        labs = [{"id": lab.id, "title": lab.title} for lab in LABS.values()]
        faults = [{"name": n, "lab": f[0], "what it breaks": f[3]} for n, f in FAULTS.items()] if args.faults else []
        if args.json:
            print(json.dumps({"labs": labs, **({"faults": faults} if args.faults else {})}, indent=1))
        else:
            for lab in LABS.values():
                print(f"lab {lab.id}  {lab.title}  ({lab.module}.py, about {lab.minutes} min)")
            if faults:
                print()
            for f in faults:
                print(f"fault {f['name']:<22} lab {f['lab']}  {f['what it breaks']}")
        return 0
    if args.command == "release":
        from minivllm.labs.grader import EXERCISES
        from minivllm.labs.release import release
        try:
            written = release(args.dir, LABS, EXERCISES, Path(__file__).resolve().parents[2] / "notebooks")
        except ValueError as e:
            parser.error(str(e))
        print("\n".join(str(p) for p in written))
        return 0
    if args.command == "student":
        from minivllm.labs.grader import EXERCISES
        from minivllm.labs.handout import write_pages
        from minivllm.labs.student import write_student_copies
        notebooks = Path(__file__).resolve().parents[2] / "notebooks"
        for path in [*write_pages(args.dir, LABS), *write_student_copies(args.dir, EXERCISES, notebooks)]:
            print(path)
        return 0
    from minivllm.labs.grader import check_lab
    if args.command == "check":
        if args.n not in LABS:
            parser.error(f"no lab {args.n}: choose one of {sorted(LABS)}")
        if args.inject is not None and args.inject not in FAULTS:
            parser.error(f"unknown fault {args.inject!r}: `python -m minivllm.labs list --faults` names them")
        if args.inject is not None and FAULTS[args.inject][0] != args.n:
            parser.error(f"fault {args.inject!r} belongs to lab {FAULTS[args.inject][0]}, not lab {args.n}")
        passed, total = check_lab(args.n, args.submission, args.inject, timeout=args.timeout,
                                  memory_mb=args.memory_mb, first_failure=not args.all,
                                  cached=not args.fresh_reference)
        return 0 if passed == total else 1
    try:
        lab_ids = sorted(LABS) if not args.labs else [int(x) for x in args.labs.split(",")]
    except ValueError:
        parser.error(f"--labs {args.labs!r}: give lab numbers separated by commas, e.g. --labs 2,7")
    bad = [n for n in lab_ids if n not in LABS]
    if bad:
        parser.error(f"no lab {bad}: choose from {sorted(LABS)}")
    if not Path(args.submissions_dir).is_dir():
        parser.error(f"{args.submissions_dir} is not a folder: give the folder holding one subfolder per student")
    students = sorted(p for p in Path(args.submissions_dir).iterdir() if p.is_dir())
    sources = {}  # every file read before anyone is graded: a submission cannot rewrite a classmate's
    for student in students:
        folder = student / "exercises" if (student / "exercises").is_dir() else student
        for n in lab_ids:
            path = folder / f"{LABS[n].module}.py"
            sources[student.name, n] = (folder, path.read_text(errors="replace") if path.is_file() else None)
    feedback_dir = Path(args.feedback) if args.feedback else Path(args.csv).with_name(Path(args.csv).stem +
                                                                                       "_feedback")
    feedback_dir.mkdir(parents=True, exist_ok=True)
    from minivllm.labs.grader import references
    for n in lab_ids:  # every reference computed (or read and verified) before any submission runs
        references(n, args.timeout, cached=not args.fresh_reference)
    rows, root = [], Path(args.submissions_dir).resolve()
    skip = (feedback_dir.resolve(), Path(args.csv).resolve())  # the grader's own output may sit in the class folder
    for student in students:
        sections, summary = [], []
        for n in lab_ids:
            print(f"== {student.name}, lab {n}")
            t, lines, report = time.time(), [], {}
            folder, source = sources[student.name, n]

            def both(line, lines=lines):
                print(line)
                lines.append(line)
            if source is None:
                both(f"FAIL  missing: no {LABS[n].module}.py in {student.name}'s folder")
                passed, total, report["status"] = 0, len(LABS[n].checks), "missing"
            else:
                before = _digest(root, skip)
                passed, total = check_lab(n, folder, source=source, timeout=args.timeout, memory_mb=args.memory_mb,
                                          out=both, cached=not args.fresh_reference, deny=[root], report=report)
                if _digest(root, skip) != before:  # confine.py refuses every write there; this checks behind it
                    both(f"FAIL  refused: the class folder {root} changed while your file was graded")
                    passed, report["status"] = 0, "error"
            rows.append([student.name, n, report["status"], passed, total, f"{passed / total:.2f}",
                         f"{time.time() - t:.1f}"])
            summary.append(f"  lab {n:>2}  {passed}/{total} checks  score {passed / total:.2f}  ({report['status']})")
            sections += [f"## lab {n}: {LABS[n].title}", *lines, ""]
        (feedback_dir / f"{student.name}.txt").write_text("\n".join(
            [f"Feedback for {student.name}", "", *summary, "", FEEDBACK_KEY, "", *sections]))
    with open(args.csv, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["student", "lab", "status", "passed", "total", "score", "seconds"])
        writer.writerows(rows)
    print(f"wrote {args.csv}: {len(students)} students x {len(lab_ids)} labs; feedback in {feedback_dir}/")
    return 0


FEEDBACK_KEY = """How to read this: one section per lab, one line per check, in the order they ran.
  ok:   the check passed.
  FAIL: the check failed: "where" says at which step, request or case, "expected" what the reference engine
        gave, "got" what yours gave, and "hint" which rule of the function's docstring to re-read.
  skip: not run: an earlier check failed first (run `check N --all` yourself to see them all), or did not
        finish in time.
Status: graded (every check ran), missing (no file for the lab), error (the file did not load, or was refused:
the line says why), timeout (a check ran past the time bound: the lab stopped there).
Run the same checks yourself with `python -m minivllm.labs check N --submission YOUR_FILE`."""


def _digest(root: Path, skip=()) -> str:
    """A hash of every file's path and content under the class folder (but `skip`): a change while grading is
    tampering."""
    import hashlib
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if any(path == s or s in path.parents for s in skip):
            continue
        if path.is_file() and not path.is_symlink():
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _bounds(parser) -> None:
    from minivllm.labs.sandbox import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S
    parser.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                        help=f"time bound of each check, in its own process (default {DEFAULT_TIMEOUT_S:g})")
    parser.add_argument("--fresh-reference", action="store_true", help="recompute the reference observations "
                        "instead of reading them from the cache (<MINIVLLM_CACHE_DIR>/labs-reference/)")
    parser.add_argument("--memory-mb", type=int, default=DEFAULT_MEMORY_MB, metavar="MB",
                        help=f"memory each grading process may add to the loaded engine (default {DEFAULT_MEMORY_MB})")


if __name__ == "__main__":
    sys.exit(main())
