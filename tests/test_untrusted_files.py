"""Files minivllm reads but did not write itself: a planted or broken CPU-ops library, an edited GGUF, a hostile
config.json. Each is refused, rebuilt or re-keyed; none is trusted, none kills the engine."""
from __future__ import annotations

import ast
import hashlib
import json
import logging
import math
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from minivllm import _C, envs
from minivllm.csrc import build as ops_build
from minivllm.models import loader

ROOT = Path(__file__).resolve().parent.parent


# --- 1. one module reads the environment -------------------------------------------------------------------------

def test_cache_dir_is_read_in_envs_and_the_ops_do_not_import_the_model_loader(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    assert envs.cache_dir() == tmp_path and loader.cache_dir() == tmp_path
    assert ops_build.library_path().parent == tmp_path / "ops"
    monkeypatch.delenv("MINIVLLM_CACHE_DIR")
    assert envs.cache_dir() == Path.home() / ".cache" / "minivllm"
    ops = (ROOT / "minivllm" / "_C.py").read_text()
    imported = [node.module for node in ast.walk(ast.parse(ops)) if isinstance(node, ast.ImportFrom)]
    assert not any(name.startswith("minivllm.models") for name in imported), imported
    for module in ("minivllm/_C.py", "minivllm/models/loader.py"):
        assert "os.environ" not in (ROOT / module).read_text(), f"{module} reads the environment itself"


@pytest.mark.parametrize("name, read", [("MINIVLLM_CPU_KERNELS", envs.cpu_kernels),
                                        ("MINIVLLM_CPU_PACKED_LINEAR", envs.cpu_packed_linear)])
def test_switches_are_on_unless_set_to_zero(name, read, monkeypatch):
    monkeypatch.delenv(name, raising=False)
    assert read()
    monkeypatch.setenv(name, "0")
    assert not read()


# --- 2. the compiled CPU ops: never load a library we did not build --------------------------------------------

@pytest.fixture
def fresh_ops(tmp_path, monkeypatch):
    """An empty private cache dir and a _C that has not tried to load yet; the warnings it logs, as a list."""
    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(cache))
    monkeypatch.delenv("MINIVLLM_CPU_KERNELS", raising=False)
    monkeypatch.setattr(_C, "_lib", None)
    monkeypatch.setattr(_C, "_tried", False)
    warnings: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger("minivllm").addHandler(handler)
    yield warnings
    logging.getLogger("minivllm").removeHandler(handler)


def _retry(monkeypatch) -> None:
    monkeypatch.setattr(_C, "_lib", None)
    monkeypatch.setattr(_C, "_tried", False)


def _compile(source: str, out: Path, *flags: str) -> Path:
    out.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    c_file = out.parent.parent / f"{out.stem}.c"  # beside the folder, not in it
    c_file.write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, str(c_file), "-o", str(out)], check=True, timeout=60)
    return out


def _plant(path: Path, marker: Path) -> None:
    """A library whose constructor, were it ever dlopen-ed, would create `marker`."""
    _compile('#include <stdio.h>\n__attribute__((constructor)) static void planted(void) '
             '{ FILE *f = fopen(MARKER, "w"); if (f) fclose(f); }\n', path, f'-DMARKER="{marker}"')


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rms_norm_matches_torch() -> bool:
    x, w = torch.randn(3, 64), torch.randn(64)
    want = w * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return torch.allclose(_C.rms_norm(x, w, 1e-6), want, atol=1e-5)


needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")


@needs_gcc
def test_a_fresh_cache_builds_records_and_then_reuses_our_library(fresh_ops, monkeypatch):
    path = ops_build.library_path()
    assert _C.available() and _rms_norm_matches_torch()
    assert ops_build.digest_path(path).read_text().strip() == _sha256(path)
    assert (path.parent.stat().st_mode & 0o777) == 0o700
    built = path.stat().st_mtime_ns
    _retry(monkeypatch)
    assert _C.available() and path.stat().st_mtime_ns == built and fresh_ops == []  # loaded, not rebuilt


@needs_gcc
@pytest.mark.parametrize("sidecar", ["none", "forged"])
def test_a_library_planted_at_the_cache_path_is_never_loaded_but_rebuilt(fresh_ops, tmp_path, sidecar):
    path, marker = ops_build.library_path(), tmp_path / "constructor-ran"
    _plant(path, marker)
    if sidecar == "forged":
        ops_build.digest_path(path).write_text("0" * 64 + "\n")
    assert _C.available() and _rms_norm_matches_torch()  # our own library, rebuilt in its place
    assert not marker.exists()
    assert ops_build.digest_path(path).read_text().strip() == _sha256(path)
    why = "has no sha256 record" if sidecar == "none" else "does not match the sha256 recorded"
    assert len(fresh_ops) == 1 and f"{path} {why}" in fresh_ops[0] and "rebuilding it" in fresh_ops[0]


@needs_gcc
def test_the_engine_runs_on_its_own_kernels_when_a_library_is_planted(fresh_ops, tmp_path, tiny_llama_folder):
    from conftest import hf_greedy
    from minivllm import LLM, SamplingParams
    marker = tmp_path / "constructor-ran"
    _plant(ops_build.library_path(), marker)
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, num_gpu_blocks_override=16)
    try:
        out = llm.generate([{"prompt_token_ids": [1, 2, 3, 4]}], SamplingParams(temperature=0, max_tokens=5))
    finally:
        llm.shutdown()
    assert not marker.exists() and _C.available()
    assert list(out[0].outputs[0].token_ids) == hf_greedy(tiny_llama_folder, [[1, 2, 3, 4]], 5)[0]


@needs_gcc
def test_a_library_missing_a_symbol_warns_and_falls_back(fresh_ops, tmp_path, monkeypatch):
    """Built and recorded by us, but from a source lacking silu_and_mul: no AttributeError escapes."""
    source = tmp_path / "partial_ops.c"
    source.write_text("void rms_norm(void) {}\n")
    monkeypatch.setattr(ops_build, "SOURCES", (source,))
    assert not _C.available() and not _C.usable(torch.zeros(1))
    assert len(fresh_ops) == 1 and "lacks a function minivllm calls" in fresh_ops[0]
    assert "MINIVLLM_CPU_KERNELS=0" in fresh_ops[0]
    from minivllm.models.layers import SiluAndMul
    x = torch.randn(2, 8)
    assert torch.allclose(SiluAndMul()(x), torch.nn.functional.silu(x[:, :4]) * x[:, 4:])  # the PyTorch path


def test_a_recorded_file_that_dlopen_rejects_warns_and_falls_back(fresh_ops):
    path = ops_build.library_path()
    path.parent.mkdir(mode=0o700)
    path.write_bytes(b"not an ELF file")
    ops_build.digest_path(path).write_text(_sha256(path) + "\n")
    assert not _C.available()
    assert len(fresh_ops) == 1 and "CPU kernels unavailable, using the PyTorch path instead" in fresh_ops[0]


@needs_gcc
@pytest.mark.parametrize("which", ["cache dir", "ops dir", "library"])
def test_a_folder_or_library_others_may_write_is_refused(fresh_ops, monkeypatch, which):
    path = ops_build.library_path()
    if which == "library":
        assert _C.available()  # a genuine build, then opened up to everyone
        _retry(monkeypatch)
    else:
        path.parent.mkdir(mode=0o700)
    target = {"cache dir": path.parent.parent, "ops dir": path.parent, "library": path}[which]
    target.chmod(0o777)
    try:
        assert not _C.available()
    finally:
        target.chmod(0o700)
    assert len(fresh_ops) == 1 and f"refusing {target}: owned by uid {os.getuid()}" in fresh_ops[0]
    assert "with mode 777" in fresh_ops[0] and "chmod go-w" in fresh_ops[0]
    if which != "library":
        assert not path.exists()  # nothing is built into a folder others can write


# --- 3. a converted GGUF is keyed by its content ----------------------------------------------------------------

def test_gguf_conversion_is_keyed_by_content_not_by_size_and_mtime(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path / "cache"))
    conversions: list[bytes] = []

    def fake_convert(gguf: Path, tmp: Path) -> None:
        conversions.append(gguf.read_bytes())
        (tmp / "config.json").write_text("{}")

    monkeypatch.setattr(loader, "_convert_into", fake_convert)
    gguf = tmp_path / "tiny.gguf"
    gguf.write_bytes(b"GGUF version one")
    stamp = gguf.stat()
    first = loader.convert_gguf(gguf)
    assert first.name == f"tiny-{_sha256(gguf)[:16]}-v{loader.CONVERSION_FORMAT}" and loader.convert_gguf(gguf) == first
    assert len(conversions) == 1  # identical content: the cache serves it
    gguf.write_bytes(b"GGUF version two")  # same size ...
    os.utime(gguf, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))  # ... and same mtime
    second = loader.convert_gguf(gguf)
    assert second != first and conversions == [b"GGUF version one", b"GGUF version two"]
    copy = tmp_path / "elsewhere" / "tiny.gguf"
    copy.parent.mkdir()
    shutil.copy(gguf, copy)
    assert loader.convert_gguf(copy) == second and len(conversions) == 2  # same bytes elsewhere: one conversion


# --- 4. config.json: floats the models compute with -------------------------------------------------------------

@pytest.mark.parametrize("field", ["rms_norm_eps", "rope_theta", "rope_parameters.rope_theta"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1e-6, 0.0, "1e-6", True])
def test_config_json_with_a_non_finite_or_non_positive_float_is_refused(tiny_llama_folder, tmp_path, field, value):
    raw = json.loads((tiny_llama_folder / "config.json").read_text())
    section, _, name = field.rpartition(".")
    (raw.setdefault(section, {}) if section else raw)[name] = value
    (tmp_path / "config.json").write_text(json.dumps(raw))  # NaN and Infinity as json.dumps writes them
    with pytest.raises(ValueError, match=rf"{field} must be a finite number > 0, got {value!r}\."):
        loader.load_config(tmp_path)


def test_the_engine_refuses_a_nan_eps_before_loading_weights(tiny_llama_folder, tmp_path):
    from minivllm import LLM
    raw = json.loads((tiny_llama_folder / "config.json").read_text())
    raw["rms_norm_eps"] = math.nan
    (tmp_path / "config.json").write_text(json.dumps(raw))  # no weights: the config alone must be refused
    with pytest.raises(ValueError, match="rms_norm_eps must be a finite number > 0, got nan"):
        LLM(str(tmp_path), multiprocess=False)
    assert loader.load_config(tiny_llama_folder).rms_norm_eps > 0  # the untouched config still loads
