"""Every process a grading job started is gone when its job ends, even one that left its session (a daemon).

The zygote (sandbox.serve) makes itself a child subreaper (Linux prctl PR_SET_CHILD_SUBREAPER): a process whose
parent dies is re-parented to the zygote instead of init, however many times it forked or called setsid. After
a job, `leftovers` names every process still in the job's session or re-parented to the zygote, and
`kill_all` kills them until none is left, in a bounded number of rounds. Where there is no subreaper (not
Linux) only the job's session is killed, as before.
"""
from __future__ import annotations

import ctypes
import os
import signal

ROUNDS = 50  # a process that forks while we kill it needs one round per generation


def become_subreaper() -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER
    except (OSError, AttributeError):
        return False


def leftovers(session: int, keep: int | None = None) -> list[int]:
    """Live processes in `session` or whose parent is this process (not `keep`), from /proc."""
    me, found = os.getpid(), []
    try:
        entries = [e for e in os.listdir("/proc") if e.isdigit()]
    except OSError:
        return []
    for entry in entries:
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone since the listing
        state, ppid, sid = fields[0], int(fields[1]), int(fields[3])
        pid = int(entry)
        if pid != keep and state != "Z" and (sid == session or ppid == me):
            found.append(pid)
    return found


def kill_all(session: int) -> int:
    """Kill the session's processes and every process re-parented here, reap them; return how many there were."""
    seen: set[int] = set()
    for _ in range(ROUNDS):
        try:
            os.killpg(session, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        pids = leftovers(session)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        seen.update(pids)
        _reap()
        if not pids:
            break
    return len(seen - {session})


def _reap() -> None:
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
