"""A grading process's answer in words: the payload, or why there is none (crash, exit, hang, memory, refusal)."""
from __future__ import annotations

import json
import signal


class _Failed(Exception):
    """A check that failed for a reason other than its judge: the process crashed, hung, raised."""


class _TimedOut(_Failed):
    """The grading process did not finish within the time bound: the rest of the lab is not run."""


def _load_error(answer: dict) -> dict | None:
    try:
        payload = json.loads(answer.get("payload") or "null")
    except (ValueError, RecursionError):
        return None
    return payload.get("load_error") if isinstance(payload, dict) else None


def _outcome(answer: dict, what: str, memory_mb: int, timeout: float) -> dict:
    """The grading process's payload, or _Failed saying in words what happened to it."""
    status = answer.get("status")
    if status == "helper-died":
        raise _Failed(f"{what}: {answer['detail']}; a submission must not signal or kill other processes")
    if status == "timeout":
        raise _TimedOut(f"{what}: did not finish within {timeout:g} s (an endless loop? the time bound is --timeout)")
    if status == "too-large":
        raise _Failed(f"{what}: sent back more than 32 MB")
    if answer.get("left_running"):
        raise _Failed(f"{what}: refused: {answer['left_running']} process(es) your code started were still running "
                      f"when it ended (killed now): a lab file starts no process")
    try:
        payload = json.loads(answer["payload"]) if answer.get("payload") else None
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth: not a result
        payload = None
    if not isinstance(payload, dict):
        how = (f"was killed by signal {answer['signal']}" if answer.get("signal") is not None
               else f"exited with code {answer.get('exitcode')}")
        hint = {None: " (does your file call os._exit, sys.exit or exit()?)",
                signal.SIGXFSZ: " (it wrote a file or printed more than 16 MB)",
                signal.SIGXCPU: f" (more CPU time than the time bound of {timeout:g} s: see --timeout)"}.get(
                    answer.get("signal"), f" (over the memory bound of {memory_mb} MB? see --memory-mb)")
        printed = _quote(answer.get("output", ""))
        raise _Failed(f"{what}: the grading process {how} before sending a result{hint}{printed}")
    if "refused" in payload:
        raise _Failed(f"refused: {payload['refused']}")
    if "load_error" in payload:
        raise _Failed(f"loading the submission: {_error_text(payload['load_error'], memory_mb)}")
    return payload


def _error_text(error: dict, memory_mb) -> str:
    text = f"{error.get('type')}: {error.get('message')}"
    if error.get("where") and error.get("in_submission") is False and error.get("student"):
        text += (f" (at {error['where']}, in the engine, not in your file: it failed on what your function "
                 f"returned or changed; compare that with the contract in the docstring)")
    elif error.get("where"):
        text += f" (at {error['where']})"
    if error.get("type") == "MemoryError" and memory_mb is not None:
        text += f" (over the memory bound of {memory_mb} MB: see --memory-mb)"
    return text


def _quote(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()][-3:]
    return "" if not lines else "; it printed last: " + " / ".join(repr(line[:100]) for line in lines)
