"""Every grading job in its own process, bounded in time and memory; the grader's process only reads data back.

The grader's process (`Sandbox`) starts one helper process, the zygote, that imports torch and builds the
graders' small engines once, and never runs a submission. For each job (one check of one lab for one student,
or a load-only job) the zygote forks a fresh grading process from that pristine state: its own session, an
address-space bound (RLIMIT_AS: the engine's size plus `memory_mb`), a CPU-time bound, its stdout/stderr in a
file, a scratch working directory of its own (removed after the job). A submission's file is copied into that
folder and runs from there, confined to it (confine.py: it reads only the engine and its own folder, writes only
there, starts no process). That process runs `harness.run_job` and writes the payload (JSON) to a pipe; the
zygote waits at most `timeout` seconds, then kills the process and every process it left behind, in its session
or re-parented to the zygote (reaper.py), and answers the grader with the payload (or none), the exit status,
how many processes were left behind and the tail of what the process printed. A crash, an exit, a hang or a
print therefore reaches the grader as data, never as a score.
"""
from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from minivllm.labs import reaper

DEFAULT_TIMEOUT_S = 120.0  # per check: far above what any reference check takes, so it only ends a runaway
DEFAULT_MEMORY_MB = 2048  # per grading process, beyond the loaded engine (about 2.5 GB of address space)
MAX_PAYLOAD = 32 << 20
OUTPUT_TAIL = 1500
_ROOT = str(Path(__file__).resolve().parents[2])  # the grading processes import this same copy of minivllm


class SandboxDied(RuntimeError):
    """The zygote itself is gone (a submission killed it, or it could not start): the job has no answer."""


class Sandbox:
    """The grader's handle on the zygote: `run(job)` -> the zygote's answer (a dict); restarts it when it dies."""

    def __init__(self):
        self.proc, self.log_tail = None, ""  # log_tail: the zygote's last output when it died

    def _start(self) -> None:
        cmd_r, cmd_w = os.pipe()
        res_r, res_w = os.pipe()
        self._log = tempfile.TemporaryFile()
        code = f"import sys; sys.path.insert(0, {_ROOT!r}); from minivllm.labs.sandbox import serve; serve()"
        self.proc = subprocess.Popen([sys.executable, "-c", code, str(cmd_r), str(res_w)], pass_fds=(cmd_r, res_w),
                                     stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        os.close(cmd_r)
        os.close(res_w)
        self._cmd, self._res, self._buf = os.fdopen(cmd_w, "wb"), res_r, b""

    def run(self, job: dict, deadline_s: float) -> dict:
        if self.proc is None or self.proc.poll() is not None:
            self._start()
        try:
            self._cmd.write(json.dumps(job).encode() + b"\n")
            self._cmd.flush()
            return json.loads(self._read_line(time.monotonic() + deadline_s))
        except (OSError, ValueError, SandboxDied) as e:
            self._log.seek(max(0, self._log.seek(0, 2) - OUTPUT_TAIL))
            self.log_tail = self._log.read().decode(errors="replace")
            self.close()
            raise SandboxDied(f"the grader's helper process stopped ({e})") from None

    def _read_line(self, deadline: float) -> bytes:
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._res], [], [], left)[0]:
                raise SandboxDied("no answer in time")
            chunk = os.read(self._res, 1 << 20)
            if not chunk:
                raise SandboxDied("it exited")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line

    def close(self) -> None:
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
            for f in (self._cmd,):
                try:
                    f.close()
                except OSError:
                    pass
            os.close(self._res)
            self.proc = None


# -- the zygote (its own process) -------------------------------------------------------------------------
def serve() -> None:
    """The zygote's loop: one JSON job per line on the command pipe, one JSON answer per line on the result pipe."""
    cmd_fd, res_fd = int(sys.argv[1]), int(sys.argv[2])
    import torch
    torch.set_num_threads(1)  # no OpenMP pool before fork: a forked process's first parallel region cannot hang
    from minivllm.labs import engine_checks as ec
    from minivllm.labs.harness import needs_engine
    from minivllm.labs.registry import LABS
    reaper.become_subreaper()  # a process a job leaves behind comes back to the zygote, which kills it
    try:  # a student edition's compiled references, read before any submission runs (it may not read them)
        from minivllm import _labref
        _labref.load()
    except ImportError:
        pass
    with os.fdopen(cmd_fd, "rb") as commands:
        for line in commands:
            job = json.loads(line)
            check = job.get("check")
            if check is not None and needs_engine(LABS[job["lab"]].checks[check][1]):
                ec.use(LABS[job["lab"]])  # build the lab's engine here, once, so every fork starts
                ec.get_llm()  # from it (not for a unit check: a failing unit check never waits for the model)
            answer = _run_forked(job, (cmd_fd, res_fd))
            data = json.dumps(answer).encode() + b"\n"
            while data:
                data = data[os.write(res_fd, data):]


def _run_forked(job: dict, own_fds: tuple) -> dict:
    r, w = os.pipe()
    out = tempfile.TemporaryFile()
    scratch = tempfile.mkdtemp(prefix="minivllm-lab-")
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child({**job, "scratch": scratch}, w, r, out, own_fds)
    os.close(w)
    payload, status, deadline = b"", "done", time.monotonic() + job["timeout"]
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            status = "timeout"
            break
        chunk = os.read(r, 1 << 20)
        if not chunk:
            break
        payload += chunk
        if len(payload) > MAX_PAYLOAD:
            status = "too-large"
            break
    os.close(r)
    reaped = (0, 0)
    while status == "done" and time.monotonic() < deadline:  # the pipe closed: the process should exit now
        reaped = os.waitpid(pid, os.WNOHANG)
        if reaped != (0, 0):
            break
        time.sleep(0.01)
    _kill_group(pid)
    wstatus = reaped[1] if reaped != (0, 0) else os.waitpid(pid, 0)[1]
    left = reaper.kill_all(pid)  # the whole session, and whatever left it: nothing the job started survives it
    shutil.rmtree(scratch, ignore_errors=True)
    out.seek(max(0, out.seek(0, 2) - OUTPUT_TAIL))
    tail = out.read().decode(errors="replace")
    out.close()
    return {"status": status, "payload": payload.decode(errors="replace") if status == "done" else None,
            "exitcode": os.WEXITSTATUS(wstatus) if os.WIFEXITED(wstatus) else None,
            "signal": os.WTERMSIG(wstatus) if os.WIFSIGNALED(wstatus) else None, "output": tail,
            "left_running": left}


def _kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _child(job: dict, w: int, r: int, out, own_fds: tuple) -> None:
    """The grading process: bound it, run the job, write the payload, exit. Never returns."""
    import resource
    try:
        os.setsid()
        _die_with_parent()
        os.close(r)
        for fd in own_fds:
            os.close(fd)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        limit = size + int(job["memory_mb"]) * (1 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        cpu = int(job["timeout"]) + 5
        resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu))
        resource.setrlimit(resource.RLIMIT_FSIZE, (16 << 20, 16 << 20))
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        os.chdir(job["scratch"])
        tempfile.tempdir = job["scratch"]  # temporary files of the job go in its scratch folder too
        if job["mode"] == "student":
            _confine(job)
        from minivllm.labs.harness import run_job
        payload = run_job(job)
        try:
            data = json.dumps(payload, default=_plain).encode()
        except (TypeError, ValueError) as e:
            data = json.dumps({"obs": {}, "calls": {}, "error": {"type": type(e).__name__, "message": str(e)[:300],
                                                                    "where": None, "in_submission": False}}).encode()
        while data:
            data = data[os.write(w, data):]
    except BaseException:  # noqa: BLE001 - the grader's own failure: say so in the output, exit non-zero
        import traceback
        traceback.print_exc()
        os._exit(70)
    os._exit(0)


def _confine(job: dict) -> None:
    """The submission's own copy in the scratch folder, and the kernel's confinement (confine.landlock) on."""
    from minivllm.labs import confine
    path = os.path.join(job["scratch"], os.path.basename(job["path"]))
    with open(path, "w") as f:
        f.write(job["source"])
    job["path"] = path
    sys.dont_write_bytecode = True  # an import writes no .pyc: the only writes left are the submission's
    job["deny"] = [*(job.get("deny") or []), *confine.answer_paths()]
    job["landlock"] = confine.landlock(job["scratch"], job["deny"])


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the zygote dies (prctl PR_SET_PDEATHSIG), so nothing outlives the grader."""
    try:
        import ctypes
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass  # not Linux: the timeout and RLIMIT_CPU still bound the process


def _plain(value):
    """JSON for the few non-JSON values an observation may hold (numpy scalars, bytes)."""
    if isinstance(value, bytes):
        return value.hex()
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"{type(value).__name__} is not plain data")
