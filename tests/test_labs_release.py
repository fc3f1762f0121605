"""The student edition (`python -m minivllm.labs release DIR`, issue 47): no reference body anywhere in it, no
faults, pip-installable, and `check` grades in it with the engine running the compiled references."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from minivllm.labs.faults import FAULTS
from minivllm.labs.grader import EXERCISES
from minivllm.labs.registry import LABS
from minivllm.labs.release import lab_functions
from minivllm.labs.student import BEGIN, END

pytestmark = pytest.mark.timeout(900)
from test_labs_isolation import HONEST  # noqa: E402 (lab 7's honest submission, one copy)


@pytest.fixture(scope="module")
def edition(tmp_path_factory):
    dest = tmp_path_factory.mktemp("edition") / "class"
    out = subprocess.run([sys.executable, "-m", "minivllm.labs", "release", str(dest)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return dest


def _normal(text: str) -> str:
    return "\n".join(line.strip() for line in text.splitlines() if line.strip() and not line.strip().startswith("#"))


def _bodies() -> dict:
    """Every reference body: each exercise's solution blocks, and each engine function a lab replaces (its code
    after the docstring)."""
    bodies = {}
    for path in sorted(EXERCISES.glob("lab*.py")):
        for n, block in enumerate(path.read_text().split(BEGIN)[1:]):
            bodies[f"{path.name}, solution {n}"] = _normal(block.split(END)[0])
    for key, fn in lab_functions(LABS):
        source = textwrap.dedent(inspect.getsource(fn))
        doc = inspect.getdoc(fn)
        body = source.split('"""', 2)[2] if doc and source.count('"""') >= 2 else source.split(":\n", 1)[1]
        bodies[key] = _normal(body)
    return bodies


def test_no_reference_body_is_anywhere_in_the_edition(edition):
    texts = {p: _normal(p.read_text(errors="replace")) for p in edition.rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", ".ipynb", ".txt", ".toml", ".json", ".cfg")}
    bodies = _bodies()
    assert len(bodies) >= 2 * len(LABS)
    found = [(name, str(path)) for name, body in bodies.items() for path, text in texts.items() if body in text]
    assert not found, found
    binary = (edition / "minivllm" / "_labref.bin").read_bytes()
    assert b"labs/exercises" not in binary and str(Path(__file__).parents[1]).encode() not in binary


def test_the_edition_holds_no_fault_and_lists_none(edition):
    assert not list(edition.rglob("faults*.py")) and not (edition / "tests").exists()
    env = {**os.environ, "PYTHONPATH": str(edition)}
    out = subprocess.run([sys.executable, "-m", "minivllm.labs", "list", "--faults"], capture_output=True,
                         text=True, timeout=120, env=env, cwd=edition.parent)
    assert out.returncode == 0 and not [name for name in FAULTS if name in out.stdout], out.stdout


def test_the_edition_is_a_wheel_with_its_compiled_references(edition, tmp_path):
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                          str(tmp_path), str(edition)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    names = zipfile.ZipFile(next(tmp_path.glob("*.whl"))).namelist()
    assert "minivllm/_labref.bin" in names and "minivllm/labs/registry.py" in names
    assert not [n for n in names if "faults" in n]


@pytest.mark.parametrize("who, source, score", [
    ("honest", HONEST, "1.00"), ("stub", "\ndef hash_block_tokens(p, t):\n    raise NotImplementedError\n", "0.00"),
    # the compiled reference reached without naming it: this lab's references are gone from the grading process
    ("reaches", "import minivllm\n_r = getattr(minivllm, '_lab' + 'ref')\n\ndef hash_block_tokens(p, t):\n"
                "    return _r.reference('minivllm.core.kv_cache_utils:hash_block_tokens')(p, t)\n", "0.00")])
def test_check_grades_in_the_edition(edition, tmp_path, who, source, score):
    (tmp_path / "lab07_block_hash.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(edition)}
    out = subprocess.run([sys.executable, "-m", "minivllm.labs", "check", "7", "--all", "--submission",
                          str(tmp_path / "lab07_block_hash.py")], capture_output=True, text=True, timeout=800,
                         env=env, cwd=tmp_path)
    assert out.stdout.splitlines()[-1].endswith(f"score {score}"), (out.stdout[-3000:], out.stderr[-2000:])
