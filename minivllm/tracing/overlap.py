"""Async scheduling in the text trace: how step N+1's schedule() overlapped step N's execute_model, and the
placeholder tokens it scheduled before their values were known, then reconciled.

Times are milliseconds on one clock (time.monotonic: EngineCore and the workers share it). Without async
scheduling a trace carries none of these fields and nothing here prints.
"""
from __future__ import annotations

from minivllm.tracing.text import atom, fmt_list

HEADER = ("async scheduling: EngineCore's batch queue holds two steps. Step N+1 is scheduled while step N runs; "
          "a running request then gets a token whose value is not known yet (a placeholder, counted per request "
          "as req:in-flight tokens; the runner fills the value in), and step N's output is applied one step later, "
          "where a request that finished in step N has its step-N+1 token dropped.")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def async_notes(sched: dict, update: dict, previous: dict | None) -> list[str]:
    """One line on when this step's schedule() began against the previous step's execute_model, with the
    placeholders it left in flight, and one on the outputs dropped at reconciliation; empty without async."""
    if "schedule_began" not in sched:
        return []
    placeholders = " ".join(f"{r}:{n}" for r, n in (sched.get("placeholders") or {}).items())
    line = f"placeholders {placeholders or 'none'}"
    if previous is not None and "began" in previous:
        start, length = sched["schedule_began"] - previous["began"], previous["ended"] - previous["began"]
        when = (f"began {_ms(start)} into step {previous['step']}'s execute_model (which ran {_ms(length)})"
                if start < length else f"began {_ms(start - length)} after step {previous['step']}'s execute_model "
                                        f"ended")
        line = f"schedule() {when}; {line}"
    notes = [line]
    dropped = update.get("dropped") or {}
    if dropped:
        notes.append("dropped: " + ", ".join(atom(f"{r}'s token {fmt_list(t)}") for r, t in dropped.items())
                     + " (the request finished in the step before)")
    return notes
