"""Waiting for an idle machine before a measured round, shared by the benchmarks that alternate systems.

After vLLM's CPU build returns a round its processes keep the CPUs busy for another 1.2-1.5 s (minivllm's
for 0.1-0.4 s); a round started at once shares the machine with that tail and is charged for it. Every
alternating benchmark (vs_vllm.py, serve_vs_vllm.py, sweep.py) waits before each round until the CPUs were
almost idle for a short window, the same for every system, and prints how long it waited.
"""
from __future__ import annotations

import time
from pathlib import Path


def cpu_busy_ticks() -> tuple[int, int]:
    """(busy, total) clock ticks of all CPUs since boot, from /proc/stat (idle and iowait count as not busy)."""
    ticks = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(ticks) - ticks[3] - ticks[4], sum(ticks)


def wait_until_idle(window: float = 0.1, busy_below: float = 0.05, timeout: float = 10.0) -> float:
    """Wait until the machine's CPUs were busy less than `busy_below` of a `window`. Returns the seconds waited;
    gives up after `timeout`, or at once where /proc/stat is missing."""
    start = time.perf_counter()
    if not Path("/proc/stat").exists():
        return 0.0
    while time.perf_counter() - start < timeout:
        busy0, total0 = cpu_busy_ticks()
        time.sleep(window)
        busy1, total1 = cpu_busy_ticks()
        if total1 > total0 and (busy1 - busy0) / (total1 - total0) < busy_below:
            break
    return time.perf_counter() - start
