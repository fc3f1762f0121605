"""Inside one grading process: load the functions, plug them into the engine, observe one check, return data.

Runs in a process the sandbox forked for one job, and only there: a submission's code is imported here and
nowhere else. `run_job` never raises; it returns a plain-data payload the grader's process judges:
    {"loaded": true}                                  (a load-only job: the file imports and is acceptable)
    {"refused": "..."}                                (guard.py refused it)
    {"load_error": {type, message, where}}            (the import raised)
    {"obs": {...}, "calls": {name: n}, "error": {...} or null}   (one check's observation)
Modes: "student" (a submission's source, guarded), "exercise" (our reference exercise file), "fault" (the
exercise file with one named fault), "engine" (the engine's own functions: the reference observation).
"""
from __future__ import annotations

import contextlib
import importlib
import inspect
import traceback
import types
from unittest import mock

from minivllm.labs import engine_checks as ec
from minivllm.labs import confine, guard
from minivllm.labs.registry import LABS


def run_job(job: dict) -> dict:
    lab, mode = LABS[job["lab"]], job["mode"]
    filename = job.get("path") or "<submission>"
    tripped: list = []
    try:
        if mode == "student":
            if "scratch" in job:  # in the sandbox's grading process: confined from here on (confine.py)
                confine.python_guard(job["scratch"], job["deny"])
            _forget_answers(lab)
            guard.install_tripwires(lab, tripped)
        functions = _load(lab, job, filename)
    except BaseException as e:  # noqa: BLE001 - whatever the file raised is reported, never re-raised here
        if confine.VIOLATIONS:
            return {"refused": confine.VIOLATIONS[0]}
        if isinstance(e, ImportError) and guard.REFUSED in str(e):
            return {"refused": str(e).split(guard.REFUSED, 1)[1]}
        return {"load_error": describe(e, filename)}
    if mode == "student" and (why := _refusal(lab, functions, filename, tripped)):
        return {"refused": why}
    if job.get("check") is None:
        return {"loaded": True}
    _, observe, _ = lab.checks[job["check"]]
    calls = dict.fromkeys(functions, 0)
    counted = {name: _counted(name, fn, calls) for name, fn in functions.items()}
    obs, error = {}, None
    try:
        ec.use(lab)
        llm = ec.get_llm() if needs_engine(observe) else None  # a unit check runs without the model
        with plugged(lab, counted):
            observe(counted, llm, obs)
    except BaseException as e:  # noqa: BLE001
        error = {**describe(e, filename), "student": mode == "student"}
    if mode == "student" and (why := _refusal(lab, functions, filename, tripped)):
        return {"refused": why}
    return {"obs": obs, "calls": {n: calls[n] for n in lab.functions}, "error": error}


def _forget_answers(lab) -> None:
    """In a student edition (release.py), drop this lab's compiled references from this process: the checks patch
    the submission's functions in, so nothing calls them, and the submission cannot reach them."""
    try:
        from minivllm import _labref
    except ImportError:
        return  # the instructor's tree: the references are the engine's source
    from minivllm.labs.release import lab_keys
    _labref.forget(lab_keys(lab))


def _refusal(lab, functions: dict, filename: str, tripped: list) -> str | None:
    if confine.VIOLATIONS:  # refused even where the submission caught the PermissionError
        return confine.VIOLATIONS[0].replace("refused: ", "")
    return guard.runtime_refusal(lab, functions, filename, tripped)


def needs_engine(observe) -> bool:
    """False for a unit check (marked by unit_checks.unit): the grading process then builds no engine."""
    return getattr(observe, "needs_engine", True)


def _load(lab, job: dict, filename: str) -> dict:
    mode = job["mode"]
    if mode == "engine":
        return lab.engine_functions()
    if mode in ("exercise", "fault"):
        module = importlib.import_module(f"minivllm.labs.exercises.{lab.module}")
    else:
        module = types.ModuleType(f"submission_{lab.module}")
        module.__file__ = filename
        module.__dict__["__builtins__"] = guard.guarded_builtins(lab)
        exec(compile(job["source"], filename, "exec"), module.__dict__)  # noqa: S102 - the submission, isolated
    functions = {**lab.fixed, **{name: getattr(module, name, None) for name in lab.functions}}
    missing = [name for name in lab.functions if functions[name] is None]
    if missing:
        raise AttributeError(f"the file defines no {', '.join(missing)}: keep the stub's def and write its body")
    if mode == "fault":
        from minivllm.labs.faults import FAULTS
        _, name, broken, _ = FAULTS[job["fault"]]
        functions[name] = broken
    return functions


def _counted(name: str, fn, calls: dict):
    def counted(*args, **kwargs):
        calls[name] += 1
        return fn(*args, **kwargs)
    return counted


@contextlib.contextmanager
def plugged(lab, functions: dict):
    """Our functions replaced by the given ones for the duration; restored afterwards."""
    with contextlib.ExitStack() as stack:
        for name, targets in lab.targets.items():
            for obj, attr in targets:
                fn = functions[name]
                if isinstance(inspect.getattr_static(obj, attr), staticmethod) and not isinstance(fn, staticmethod):
                    fn = staticmethod(fn)  # a staticmethod target (lab 13) stays one: no self is passed
                stack.enter_context(mock.patch.object(obj, attr, fn))
        yield


def describe(e: BaseException, filename: str) -> dict:
    """An exception as data: type, message, and where: the deepest frame in the submission's file if any."""
    try:
        message = str(e)[:600]
    except BaseException:  # noqa: BLE001 - a submission's exception whose str() itself fails
        message = "(its message could not be printed)"
    frames = traceback.extract_tb(e.__traceback__)
    own = [f for f in frames if f.filename == filename]
    where = (own or frames or [None])[-1]
    return {"type": type(e).__name__, "message": message,
            "where": None if where is None else f"{where.filename.rsplit('/', 1)[-1]}:{where.lineno}",
            "in_submission": bool(own)}
