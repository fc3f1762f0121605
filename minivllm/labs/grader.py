"""Grade one lab: load a submission's exercise file, plug its functions into the engine, run the lab's checks.

A check that raises LabCheckFailed fails with its message; NotImplementedError fails with the stub's own
message (it names the function to write); any other exception fails as "raised <type>: <message>" at the check.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import traceback
from pathlib import Path
from unittest import mock

from minivllm.labs import engine_checks
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.faults import FAULTS
from minivllm.labs.registry import LABS, reference

EXERCISES = Path(__file__).parent / "exercises"


def load_functions(lab, submission: str | Path | None = None, fault: str | None = None) -> dict:
    """{function name: function} from the submission (a file, or a folder holding the lab's file) or ours."""
    if submission is None:
        module = importlib.import_module(f"minivllm.labs.exercises.{lab.module}")
    else:
        path = Path(submission)
        if path.is_dir():
            path = path / f"{lab.module}.py"
        if not path.is_file():
            raise FileNotFoundError(f"no {lab.module}.py in the submission {submission}")
        spec = importlib.util.spec_from_file_location(f"submission_{lab.module}", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    functions = {**lab.fixed, **{name: getattr(module, name) for name in lab.functions}}
    if fault is not None:
        _, name, broken, _ = FAULTS[fault]
        functions[name] = broken
    return functions


@contextlib.contextmanager
def plugged(lab, functions: dict):
    """Our functions replaced by the submission's for the duration; restored afterwards."""
    with contextlib.ExitStack() as stack:
        for name, targets in lab.targets.items():
            for obj, attr in targets:
                stack.enter_context(mock.patch.object(obj, attr, functions[name]))
        yield


def check_lab(lab_id: int, submission=None, fault: str | None = None, out=print,
              first_failure: bool = False) -> tuple[int, int]:
    """Run every check of one lab; print one line per check and the score line last. Returns (passed, total).

    first_failure: stop at the first failed check (the tests' way to show a fault bites, faster).
    """
    lab = LABS[lab_id]
    try:
        functions = load_functions(lab, submission, fault)
    except Exception as e:  # a file that does not import is a failed lab, not a crash of the grader
        out(f"FAIL  loading the submission: {type(e).__name__}: {e}")
        out(f"lab {lab_id}: 0/{len(lab.checks)} checks passed  score 0.00")
        return 0, len(lab.checks)
    engine_checks.BACKEND = lab.backend
    llm = engine_checks.get_llm()
    for kind in lab.scenarios:
        reference(kind)
    passed = failed = 0
    for name, check in lab.checks:
        if first_failure and failed:
            break
        try:
            with plugged(lab, functions):
                check(functions, llm)
            passed += 1
            out(f"ok    {name}")
        except NotImplementedError as e:
            failed += 1
            out(f"FAIL  {name}: NotImplementedError: {e}")
            llm = _fresh_llm(llm)
        except LabCheckFailed as e:
            failed += 1
            out(f"FAIL  {e}")
            llm = _fresh_llm(llm)
        except Exception as e:
            failed += 1
            where = traceback.extract_tb(e.__traceback__)[-1]
            out(f"FAIL  check {name!r}: raised {type(e).__name__}: {e} (at {Path(where.filename).name}:"
                f"{where.lineno})")
            llm = _fresh_llm(llm)
    total = len(lab.checks)
    out(f"lab {lab_id}: {passed}/{total} checks passed  score {passed / total:.2f}")
    return passed, total


def _fresh_llm(llm):
    """A failed check may leave the engine's state broken (leaked blocks, stuck requests): start a new one."""
    sched = engine_checks.scheduler_of(llm)
    pool = sched.kv_cache_manager.block_pool
    clean = (not sched.has_unfinished_requests() and not sched.requests
             and pool.get_num_free_blocks() == pool.num_gpu_blocks - 1
             and all(b.ref_cnt == 0 for b in pool.blocks[1:]))
    if clean:
        return llm
    engine_checks.drop_llm()
    return engine_checks.get_llm()
