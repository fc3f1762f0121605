"""What a submission's grading process may touch: its own scratch folder and the engine, nothing else.

Two layers, both switched on in the grading process just before the submission's file runs (harness.run_job,
mode "student"), and never in the grader's or the zygote's own process:

1. The kernel (Linux Landlock, `landlock`, when the kernel has it): writes are allowed only beneath the job's
   scratch folder (and /dev/null); reads are allowed everywhere except the paths the grader names (the class
   folder, the reference solutions and faults, the reference cache); signals to processes outside the process's
   own domain, and TCP connect/bind, are refused. Native code cannot get around it. Landlock cannot allow "all
   but one folder", so the read rules grant every sibling of each denied path's ancestors instead: a file or
   folder created after the rules were made beside those ancestors is unreadable to the submission (harmless).
2. Python audit hooks (`audit_hook`, PEP 578; everywhere): an open for writing outside the scratch folder, an open
   or listing of a denied path, starting a process (fork, exec, spawn, subprocess, system), ctypes, signals to
   other processes and sockets are refused (PermissionError) and recorded in `VIOLATIONS`, so a submission that
   catches the error still scores 0 (harness.run_job turns a violation into a refusal). Reading the engine's own
   source files (not through an import) is refused without counting, so a traceback or a warning that reads a
   line does no harm. Audit hooks alone are not a security boundary (native code that opens files directly goes
   around them; that is what layer 1 is for, and why ctypes is refused).
"""
from __future__ import annotations

import ctypes
import os
import platform
import sys

VIOLATIONS: list[str] = []
_PROCESS_EVENTS = {"os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system", "os.startfile",
                   "subprocess.Popen", "pty.spawn", "os.fork_exec", "_posixsubprocess.fork_exec"}
_PATH_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.symlink", "os.link", "os.truncate",
                "os.chmod", "os.chown", "os.utime", "shutil.rmtree", "shutil.copyfile", "shutil.copytree",
                "shutil.move", "os.chflags", "os.lchmod", "os.setxattr", "os.removexattr", "os.mkfifo", "os.mknod"}
_LIST_EVENTS = {"os.listdir", "os.scandir", "glob.glob", "os.walk"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_ENGINE = os.path.realpath(os.path.join(os.path.dirname(__file__), ".."))  # minivllm/


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _real(path) -> str | None:
    if isinstance(path, int):
        return None  # an open file descriptor: checked when it was opened
    try:
        return os.path.realpath(os.fsdecode(path))
    except (TypeError, ValueError):
        return None


def audit_hook(scratch: str, deny: list[str]):
    """The hook for sys.addaudithook: see the module's docstring for what it refuses."""
    scratch, deny = os.path.realpath(scratch), [os.path.realpath(d) for d in deny]
    writable = (scratch, "/dev/null")

    def refuse(what: str, count: bool = True):
        if count:
            VIOLATIONS.append(what)
        raise PermissionError(f"refused: {what}")

    def hook(event: str, args: tuple) -> None:
        if event == "open":
            path, mode, flags = (tuple(args) + (None, None))[:3]
            real = _real(path)
            if real is None:
                return
            writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or \
                (isinstance(flags, int) and flags & _WRITE_FLAGS)
            if writing and not any(_inside(real, w) for w in writable):
                refuse(f"your code opened {path} for writing: a lab file writes only in its working folder")
            if any(_inside(real, d) for d in deny):
                refuse(f"your code opened {path}: a lab file reads only its own folder and the engine")
            if real.endswith(".py") and _inside(real, _ENGINE) and not _importing():
                refuse(f"reading the engine's source ({path}): a lab file imports the engine, never reads it", False)
        elif event in _PROCESS_EVENTS:
            refuse(f"your code started a process ({event}): a lab file starts none")
        elif event.startswith("ctypes."):
            refuse(f"your code used ctypes ({event}): a lab file needs none")
        elif event in ("os.kill", "os.killpg", "signal.pthread_kill") and args and args[0] not in (0, os.getpid()):
            refuse(f"your code sent a signal ({event}): a lab file signals no process")
        elif event in ("socket.connect", "socket.bind", "socket.sendto"):
            refuse(f"your code used the network ({event}): a lab file needs none")
        elif event in _PATH_EVENTS:
            for path in args[:2]:
                real = _real(path) if isinstance(path, (str, bytes, os.PathLike)) else None
                if real is not None and not _inside(real, scratch):
                    refuse(f"your code changed {path} ({event}): a lab file writes only in its working folder")
        elif event in _LIST_EVENTS and args:
            real = _real(args[0]) if isinstance(args[0], (str, bytes, os.PathLike)) else None
            if real is not None and any(_inside(real, d) for d in deny):
                refuse(f"your code listed {args[0]}: a lab file reads only its own folder and the engine")
    return hook


def answer_paths() -> list[str]:
    """What no submission may read: the reference solutions, the faults, the reference cache (refcache.py)."""
    from minivllm import envs
    labs = os.path.dirname(os.path.realpath(__file__))
    faults = [os.path.join(labs, n) for n in sorted(os.listdir(labs)) if n.startswith("faults")]
    cache = envs.cache_dir()
    return [os.path.join(labs, "exercises"), *faults, str(cache / "labs-reference"), str(cache / "labs-reference.key"),
            os.path.join(os.path.dirname(labs), "_labref.bin")]  # a student edition's compiled references


def python_guard(scratch: str, deny: list[str]) -> None:
    """Install the audit hook (layer 2) in this process for good: an audit hook cannot be removed."""
    sys.addaudithook(audit_hook(scratch, deny))


def _importing() -> bool:
    """True when the open comes from the import system (a module of the engine imported late), not from code."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


# -- layer 1: Landlock ---------------------------------------------------------------------------------------
_SYS = {"x86_64": (444, 445, 446), "aarch64": (444, 445, 446)}
_FS_FILE = (1 << 0) | (1 << 1) | (1 << 2)  # execute, write_file, read_file
_READ_FILE, _READ_DIR, _EXECUTE = 1 << 2, 1 << 3, 1 << 0


class _Ruleset(ctypes.Structure):
    _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed", ctypes.c_uint64), ("fd", ctypes.c_int32)]


def landlock_abi() -> int:
    """The kernel's Landlock ABI version, 0 where there is none (not Linux, an old kernel, switched off)."""
    if platform.system() != "Linux" or platform.machine() not in _SYS:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)
    return max(int(libc.syscall(_SYS[platform.machine()][0], None, ctypes.c_size_t(0), ctypes.c_uint32(1))), 0)


def landlock(scratch: str, deny: list[str]) -> bool:
    """Confine this process (and what it starts) as the module's docstring says; False where the kernel cannot."""
    abi = landlock_abi()
    if abi < 1:
        return False
    create, add_rule, restrict = _SYS[platform.machine()]
    libc = ctypes.CDLL(None, use_errno=True)
    fs = (1 << (13 if abi < 2 else 14 if abi < 3 else 15)) - 1  # every right of the ABI but ioctl on devices
    write = fs & ~(_READ_FILE | _READ_DIR | _EXECUTE)
    net = 3 if abi >= 4 else 0  # TCP bind and connect
    scoped = 3 if abi >= 6 else 0  # abstract unix sockets and signals outside the domain
    size = ctypes.sizeof(_Ruleset) if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _Ruleset(fs, net, scoped)
    rfd = libc.syscall(create, ctypes.byref(ruleset), ctypes.c_size_t(size), ctypes.c_uint32(0))
    if rfd < 0:
        return False

    def allow(path: str, access: int) -> None:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            return
        try:
            rule = _PathBeneath(access if os.path.isdir(path) else access & _FS_FILE, fd)
            libc.syscall(add_rule, rfd, 1, ctypes.byref(rule), 0)
        finally:
            os.close(fd)
    for path, access in _read_rules(deny):
        allow(path, access)
    allow(scratch, fs)
    allow("/dev/null", (1 << 1) | _READ_FILE)
    libc.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS: required to restrict oneself without CAP_SYS_ADMIN
    ok = libc.syscall(restrict, rfd, 0) == 0
    os.close(rfd)
    return ok


def _read_rules(deny: list[str]):
    """(path, read rights) for every sibling of every ancestor of a denied path that leads to none of them."""
    deny = [os.path.realpath(d) for d in deny if os.path.exists(d)]
    ancestors = {os.path.dirname(d) for d in deny}
    for d in list(ancestors):
        while d != "/":
            d = os.path.dirname(d)
            ancestors.add(d)
    read = _READ_FILE | _READ_DIR | _EXECUTE
    for folder in sorted(ancestors):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            path = os.path.join(folder, name)
            real = os.path.realpath(path)
            if any(_inside(real, d) or _inside(d, real) for d in deny):
                continue  # a denied path, one holding one (granted piecewise), or a link to either
            yield path, read
