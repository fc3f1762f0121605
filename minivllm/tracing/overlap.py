"""Async scheduling in the text trace: how step N+1's schedule() overlapped step N's execute_model, and the
placeholder tokens it scheduled before their values were known, then reconciled.

Times are milliseconds on one clock (time.monotonic: EngineCore and the workers share it). Without async
scheduling a trace carries none of these fields and nothing here prints.
"""
from __future__ import annotations

from minivllm.tracing.text import atom, fmt_list


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def overlap_line(sched: dict, previous: dict | None) -> str | None:
    """When this step's schedule() began, against the previous step's execute_model (None: nothing to compare)."""
    if "schedule_began" not in sched or previous is None or "began" not in previous:
        return None
    start = sched["schedule_began"] - previous["began"]
    length = previous["ended"] - previous["began"]
    if start < length:
        return (f"schedule() of step {sched['step']} began {_ms(start)} into step {previous['step']}'s "
                f"execute_model, which ran {_ms(length)}: planned while the previous step ran")
    return (f"schedule() of step {sched['step']} began {_ms(start - length)} after step {previous['step']}'s "
            f"execute_model ended: nothing was in flight to overlap")


def placeholder_notes(sched: dict, update: dict) -> list[str]:
    """The tokens scheduled ahead of their values (placeholders), and the outputs dropped at reconciliation."""
    notes = []
    placeholders = sched.get("placeholders") or {}
    if placeholders:
        notes.append("placeholders (tokens scheduled before their value is known; the runner fills them in): "
                     + ", ".join(atom(f"{r}: {n} in flight") for r, n in placeholders.items()))
    dropped = update.get("dropped") or {}
    if dropped:
        notes.append("dropped at update_from_output: " + ", ".join(
            atom(f"{r}'s token {fmt_list(t)}") for r, t in dropped.items())
            + " (finished in an earlier step: a token scheduled after its end never reaches the caller)")
    return notes
