"""Build, verify and find the compiled CPU op library that minivllm/_C.py loads.

The files of csrc/cpu/ (SOURCES, split by vLLM's csrc/cpu names, and HEADERS) are compiled
together into one shared library with the system's C compiler the first time an engine starts on the
CPU (a second or two) and cached under MINIVLLM_CACHE_DIR/ops/, keyed by the sources, the flags and
the CPU's instruction-set flags. -march=native lets each file take the build machine's AVX-512 and
AVX512_BF16 paths where the CPU has them, and its plain-C path where it does not (the tests build
that one too, with -mno-avx512f).

Never load a library we did not build: loading runs its constructors, so a file planted at the
predictable cache path would run as the user. The cache dir and ops/ are created 0o700 and refused
(warning, PyTorch path) when another user owns them or group/others may write them; the same holds
for the library and its sidecar. After each build a sha256 of the library is written (atomically)
next to it, `<name>.so.sha256`; a library whose bytes do not match is never dlopen-ed but rebuilt
in place. Trusted: the folders above the cache dir, and the user's own processes (only they can
write ops/, so only they could swap the file between hashing and dlopen, or rewrite the sidecar).
Not dlopen-ed through /proc/self/fd: glibc matches an already-loaded library by that name.
"""
from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from minivllm import envs, platforms

logger = logging.getLogger("minivllm")

CPU_DIR = Path(__file__).parent / "cpu"
SOURCES = tuple(CPU_DIR / name for name in ("cache.c", "cpu_attn.c", "cpu_attn_avx512.c", "cpu_attn_avx512_bf16.c",
                                            "layernorm.c", "activation.c", "pos_encoding.c", "gemm.c", "shm.c"))
HEADERS = tuple(CPU_DIR / name for name in ("cpu_types.h", "ops.h", "cpu_attn_impl.h", "cpu_attn_avx512.h"))
CFLAGS = ["-O3", "-march=native", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
          "-std=c11", "-fPIC", "-shared"]


def library_path() -> Path:
    code = b"".join(path.read_bytes() for path in (*SOURCES, *HEADERS))
    key = hashlib.sha256(code + " ".join(CFLAGS).encode() + platforms.cpu_id().encode()).hexdigest()[:16]
    return envs.cache_dir() / "ops" / f"minivllm_cpu_ops-{key}.so"


def build(path: Path, extra_flags: tuple[str, ...] = ()) -> str:
    """Compile SOURCES into one library at `path` (atomically: never half-written); return its sha256."""
    compiler = envs.c_compiler() or shutil.which("gcc") or shutil.which("cc")
    if compiler is None:
        raise RuntimeError("no C compiler found (set CC, or install gcc)")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        target = Path(tmp) / path.name
        result = subprocess.run([compiler, *CFLAGS, *extra_flags, *map(str, SOURCES), "-o", str(target), "-lm"],
                                capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            raise RuntimeError(f"{compiler} failed:\n{result.stderr.strip()}")
        digest = hashlib.sha256(target.read_bytes()).hexdigest()
        os.replace(target, path)
    return digest


class UnverifiedLibrary(RuntimeError):
    """The file at library_path() is not the one minivllm built and recorded: it is rebuilt, never loaded."""


def _check_private(st: os.stat_result, what: Path) -> None:
    """Refuse a folder or file another user owns or may write: whatever lies there could be theirs."""
    uid = os.getuid()
    if st.st_uid != uid or st.st_mode & 0o022:
        raise PermissionError(f"refusing {what}: owned by uid {st.st_uid} (you are {uid}) with mode "
                              f"{st.st_mode & 0o777:o}, so another user could plant a library there. Make it "
                              f"yours and private (chmod go-w), or point MINIVLLM_CACHE_DIR at a private folder")


def _private_dir(ops: Path) -> None:
    """Create the cache dir and ops/ with mode 0o700 where missing, then check both."""
    ops.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    ops.mkdir(mode=0o700, exist_ok=True)
    for folder in (ops.parent, ops):
        _check_private(folder.stat(), folder)


def digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _record_digest(path: Path, digest: str) -> None:
    """Write the sidecar atomically (a private temporary file, then a rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(digest + "\n")
        os.replace(tmp, digest_path(path))
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _recorded_digest(path: Path) -> str | None:
    try:
        fd = os.open(digest_path(path), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with os.fdopen(fd) as f:
        _check_private(os.fstat(fd), digest_path(path))
        return f.read().strip()


def _verify(path: Path, digest: str | None) -> None:
    """Raise unless the file's bytes hash to `digest` and only its owner may write it."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        _check_private(os.fstat(fd), path)
        sha = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            sha.update(chunk)
    finally:
        os.close(fd)
    if sha.hexdigest() != digest:
        why = "has no sha256 record" if digest is None else "does not match the sha256 recorded"
        raise UnverifiedLibrary(f"{path} {why} of the library minivllm built (planted, corrupted, "
                                f"or left by an older minivllm)")


def _build_and_record(path: Path) -> None:
    start = time.perf_counter()
    digest = build(path)
    _record_digest(path, digest)
    logger.info("compiled CPU kernels in %.1f s: %s", time.perf_counter() - start, path)
    _verify(path, digest)


def ensure_library() -> Path:
    """The path of a library minivllm built and recorded, building it first where needed."""
    path = library_path()
    _private_dir(path.parent)
    try:
        _verify(path, _recorded_digest(path))
    except FileNotFoundError:  # first use on this machine
        _build_and_record(path)
    except UnverifiedLibrary as e:
        logger.warning("%s: rebuilding it (if this recurs, check what writes to %s)", e, path.parent)
        _build_and_record(path)
    return path
