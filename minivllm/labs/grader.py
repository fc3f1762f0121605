"""Grade one lab: every check of a submission in its own bounded process, judged here from what it returns.

The submission's file is read once, refused if it imports the grader or the reference solution (guard.py),
then each check runs in a fresh grading process forked by the sandbox (sandbox.py): the process imports the
file, plugs its functions into the engine, observes, and sends the observation back as plain data. The
checks' verdicts and the score are computed here, in the grader's process, by comparing that observation
with the reference observation (the same check with the engine's own functions, computed once per process).
Nothing the submission prints, patches or exits with can change a verdict: a crash, an exit, a hang (past
`timeout` seconds) or a memory bomb (past `memory_mb`) is a failed check with a message saying so.
Hidden tests (an exercise file's `### BEGIN HIDDEN TESTS` block, student.hidden_tests) belong to the lab's first
check: once its visible cases pass, each hidden test runs on the submission in its own grading process, and a
failure fails that check naming the case, never its expected values.
"""
from __future__ import annotations

import atexit
import json
import signal
from pathlib import Path

from minivllm.labs import guard, refcache, student
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.registry import LABS
from minivllm.labs.sandbox import DEFAULT_MEMORY_MB, DEFAULT_TIMEOUT_S, Sandbox, SandboxDied
from minivllm.labs.verdicts import _error_text, _Failed, _load_error, _outcome, _TimedOut  # noqa: F401 - tests

EXERCISES = Path(__file__).parent / "exercises"
_SANDBOX: Sandbox | None = None
_REFERENCE: dict = {}  # (lab id, check index) -> the engine's own observation
_SLACK_S = 600.0  # the zygote's own time on top of a job's timeout: building an engine first


def sandbox() -> Sandbox:
    global _SANDBOX
    if _SANDBOX is None:
        _SANDBOX = Sandbox()
        atexit.register(_SANDBOX.close)
    return _SANDBOX


def lab_file(lab, submission) -> Path:
    path = Path(submission)
    return (path / f"{lab.module}.py" if path.is_dir() else path).resolve()


def read_submission(lab, submission) -> tuple[str, str]:
    """(path, source) of the lab's file in a submission (the file itself, or a folder holding it)."""
    path = lab_file(lab, submission)
    if not path.is_file():
        raise FileNotFoundError(f"no {lab.module}.py in the submission {submission}")
    return str(path.resolve()), path.read_text(errors="replace")


def check_lab(lab_id: int, submission=None, fault: str | None = None, out=print, first_failure: bool = False,
              timeout: float = DEFAULT_TIMEOUT_S, memory_mb: int = DEFAULT_MEMORY_MB,
              source: str | None = None, cached: bool = True, deny=(), report: dict | None = None) -> tuple[int, int]:
    """Run the checks of one lab in order (unit checks first); print one line per check and the score line last.
    Returns (passed, total).

    submission: a file or folder (None: our reference exercise file); source: its text, read already (`grade`
    reads every file before grading anyone). first_failure: stop at the first failed check, the rest count as
    failed (`check`'s default: a unit check that fails ends the run before any engine is built). timeout:
    seconds per check; memory_mb: each grading process's memory bound. cached: read and write the reference
    observations on disk (refcache.py); False recomputes them. deny: folders the submission may not read (`grade`
    passes the class folder; confine.py). The submission runs from a private copy of its file, never in place.
    report: a dict that gets "status": "graded", "missing" (no file), "error" (it does not load, or was refused)
    or "timeout" (a grading process ran past `timeout`: the lab ends there, its other checks are not run).
    """
    lab, total = LABS[lab_id], len(LABS[lab_id].checks)
    report = {} if report is None else report
    report["status"] = "graded"

    def score(passed: int, status: str | None = None) -> tuple[int, int]:
        report["status"] = status or report["status"]
        out(f"lab {lab_id}: {passed}/{total} checks passed  score {passed / total:.2f}")
        return passed, total
    job = {"lab": lab_id, "fault": fault, "timeout": timeout, "memory_mb": memory_mb,
           "mode": "fault" if fault else "exercise", "deny": [str(Path(d).resolve()) for d in deny]}
    if cached:  # every stored reference read (and verified) before any code of the submission runs
        for index in range(total):
            _stored(lab_id, index)
    if submission is not None:
        try:
            path, text = (read_submission(lab, submission) if source is None
                          else (str(lab_file(lab, submission)), source))
        except (OSError, ValueError) as e:
            out(f"FAIL  loading the submission: {type(e).__name__}: {e}")
            return score(0, "missing" if isinstance(e, FileNotFoundError) else "error")
        job.update(mode="student", path=path, source=text)
        if why := guard.static_refusal(job["source"], lab, path):
            out(f"FAIL  refused: {why}")
            return score(0, "error")
    try:
        _outcome(_run(job, None), "loading the submission", memory_mb, timeout)
    except _Failed as e:
        out(f"FAIL  {e}")
        return score(0, "timeout" if isinstance(e, _TimedOut) else "error")
    if fault is None and submission is None:
        job.update(path=str(lab_file(lab, EXERCISES)), source=lab_file(lab, EXERCISES).read_text())
    passed = failed = 0
    for index, (name, _, judge) in enumerate(lab.checks):
        if report["status"] == "timeout":
            out(f"skip  {name} (not run: an earlier check did not finish in time)")
            continue
        if first_failure and failed:
            out(f"skip  {name} (not run after the first failure: fix that one first, or run every check with --all)")
            continue
        try:
            reference = _reference(lab_id, index, timeout, cached)
            result = _outcome(_run(job, index), f"check {name!r}", memory_mb, timeout)
            _judge(lab, name, judge, result, reference, memory_mb)
            if index == 0 and fault is None:
                _hidden(lab, name, job)
            passed += 1
            out(f"ok    {name}")
        except LabCheckFailed as e:
            failed += 1
            text = str(e) if e.check == name else str(e).replace(f"check {e.check!r} failed", f"check {name!r} "
                                                                 f"failed (at check {e.check!r})", 1)
            out(f"FAIL  {text}")  # the check's own name first, as on its "ok" line and in the summary
        except _Failed as e:
            failed += 1
            out(f"FAIL  {e}")
            if isinstance(e, _TimedOut):
                report["status"] = "timeout"
    return score(passed)


def _hidden(lab, name: str, job: dict) -> None:
    """Run the lab's hidden tests on the job's source (the submission, or our exercise file); raise _Failed at the
    first that fails, saying which case and how, without the values it expected."""
    block, tests = student.hidden_tests(lab_file(lab, EXERCISES).read_text())
    own_lines = job["source"].count("\n") + 1  # the submission's lines; the hidden block comes after them
    for number, (test, what) in enumerate(tests, 1):
        case = f"check {name!r}: hidden case {number} of {len(tests)} ({what.rstrip('.')})"
        answer = _run({**job, "mode": "student", "source": f"{job['source']}\n\n{block}\n{test}()\n"}, None)
        try:
            payload = _outcome(answer, case, job["memory_mb"], job["timeout"])
        except _Failed as e:
            error = _load_error(answer)
            if error is None:
                raise
            where = error.get("where") or ""
            theirs = where.rpartition(":")[2].isdigit() and int(where.rpartition(":")[2]) <= own_lines
            if error.get("type") == "AssertionError" and not theirs:
                raise _Failed(f"{case}: your function's result is not the expected one (a hidden case shows no "
                              f"values: re-read the rules and invariants of the docstring)") from e
            detail = f": {error.get('message')} (at {where})" if theirs else " (in the hidden test, on your result)"
            raise _Failed(f"{case}: raised {error.get('type')}{detail}") from e
        if not payload.get("loaded"):
            raise _Failed(f"{case}: the grading process sent back no verdict")


def _run(job: dict, check) -> dict:
    try:
        return sandbox().run({**job, "check": check}, job["timeout"] + _SLACK_S)
    except SandboxDied as e:
        return {"status": "helper-died", "detail": str(e)}


def _judge(lab, name: str, judge, result: dict, reference: dict, memory_mb: int) -> None:
    obs, error = result.get("obs"), result.get("error")
    if not isinstance(obs, dict):
        raise _Failed(f"check {name!r}: the grading process sent back no observation")
    if error is not None:
        try:  # what was observed before the error (a broken invariant, a step bound) is the better message
            judge(obs, reference)
        except LabCheckFailed:
            raise
        except Exception:  # noqa: BLE001 - incomplete observation: report the error itself
            pass
        if error.get("type") == "NotImplementedError":
            raise _Failed(f"{name}: NotImplementedError: {error.get('message')}")
        raise _Failed(f"check {name!r}: raised {_error_text(error, memory_mb)}")
    try:
        judge(obs, reference)
    except LabCheckFailed:
        raise
    except Exception as e:  # noqa: BLE001 - a missing or malformed field: the observation is incomplete
        raise _Failed(f"check {name!r}: the grading process sent back an incomplete observation "
                      f"({type(e).__name__}: {e})") from None
    calls = result.get("calls") or {}
    if not any(isinstance(n, int) and n > 0 for n in calls.values()):
        raise _Failed(f"check {name!r}: your {', '.join(lab.functions)} was never called during the check")


def _reference(lab_id: int, index: int, timeout: float, cached: bool = True) -> dict:
    """The engine's own observation of one check (nothing of a submission in it): from memory, else from the disk
    cache (refcache.py), else computed in a grading process and stored in both."""
    key, name = (lab_id, index), LABS[lab_id].checks[index][0]
    if cached:
        _stored(lab_id, index)
    if key not in _REFERENCE:
        job = {"lab": lab_id, "fault": None, "timeout": max(timeout, DEFAULT_TIMEOUT_S),
               "memory_mb": DEFAULT_MEMORY_MB, "mode": "engine"}
        result = _outcome(_run(job, index), "the reference run", DEFAULT_MEMORY_MB, timeout)
        if result.get("error") or not isinstance(result.get("obs"), dict):
            raise RuntimeError(f"the grader's reference run of lab {lab_id}, check {index} failed: {result}")
        if not any(result["calls"].values()):
            raise RuntimeError(f"lab {lab_id}'s check {LABS[lab_id].checks[index][0]!r} never calls the "
                               f"functions the student writes: the grader itself needs fixing")
        _REFERENCE[key] = result["obs"]
        if cached:
            refcache.store(lab_id, index, name, result["obs"])
    return _REFERENCE[key]


def _stored(lab_id: int, index: int) -> None:
    """Keep the stored reference of the check in memory, if there is one whose signature verifies (refcache.py)."""
    key = (lab_id, index)
    if key not in _REFERENCE and (stored := refcache.load(lab_id, index, LABS[lab_id].checks[index][0])) is not None:
        _REFERENCE[key] = stored


def references(lab_id: int, timeout: float = DEFAULT_TIMEOUT_S, cached: bool = True) -> None:
    """Every reference observation of the lab in memory now (`grade` calls it before grading anyone)."""
    for index in range(len(LABS[lab_id].checks)):
        _reference(lab_id, index, timeout, cached)
