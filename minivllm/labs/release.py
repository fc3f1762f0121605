"""`python -m minivllm.labs release DIR`: the student edition, a pip-installable copy of the engine with no answer
in it (issue 47).

What a class gets in DIR: `pyproject.toml` and `minivllm/` (the engine, the grader, `check`), and the handout
(`README.md`, `labs/`, `exercises/` with the stubs, `notebooks/` without answers; student.py, handout.py).
What it does not get: the reference solutions (`labs/exercises/*.py` are the stubs there too, without hidden
tests), the faults (`labs/faults*.py`: the instructor's list of common mistakes), the tests, the docs.

How the engine still runs a lab the student has not written yet: every engine function a lab replaces (its
targets, e.g. Scheduler._preempt_request, and the functions that do its work, e.g. LLM._run_engine) keeps its
signature and docstring, and its body becomes one line, `return _minivllm_labref("<key>")(<its arguments>)`.
`minivllm/_labref.py` builds that function from the reference's compiled bytecode (marshal, in
`minivllm/_labref.bin`), with the module's own globals: the engine behaves exactly as before, `check` computes
the same reference observations, and no reference source is in the tree.
Limits (say them to the class): bytecode is not source but it is not secret either (`dis` shows it to anyone
who looks); the edition runs only on the Python minor version it was released with (marshal's format), and
`_labref` says so when it differs. Hidden tests are not in the edition: `check` there runs the visible checks.
"""
from __future__ import annotations

import ast
import inspect
import marshal
import shutil
import sys
import textwrap
import types
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]  # minivllm/
_LABREF = '''"""The reference functions of the labs, as compiled bytecode only (written by `minivllm.labs release`)."""
import importlib
import marshal
import sys
import types
from pathlib import Path

_TABLE = None
_BUILT = {}


def load():
    """Read the table once (the grader's zygote does it before any submission runs)."""
    global _TABLE
    if _TABLE is None:
        version, _TABLE = marshal.loads((Path(__file__).parent / "_labref.bin").read_bytes())
        if tuple(version) != tuple(sys.version_info[:2]):
            raise RuntimeError(f"this student edition was released for Python {version[0]}.{version[1]}; "
                               f"run it with that version (this is {sys.version_info[0]}.{sys.version_info[1]})")
    return _TABLE


def forget(keys):
    """Drop these references from this process (a grading process, before a submission of their lab runs)."""
    for key in keys:
        load().pop(key, None)
        _BUILT.pop(key, None)


def reference(key):
    """The engine's own function `key` (module:qualname), built from its bytecode with its module's globals."""
    if key not in _BUILT:
        module, code, defaults, kwdefaults = load()[key]
        fn = types.FunctionType(code, importlib.import_module(module).__dict__, code.co_name, defaults)
        fn.__kwdefaults__ = kwdefaults
        _BUILT[key] = fn
    return _BUILT[key]
'''


def lab_keys(lab) -> list[str]:
    return [key for key, _ in lab_functions({lab.id: lab})]


def lab_functions(labs) -> list:
    """Every engine function that holds a lab's answer: each lab's targets (for the functions students write)
    and its tripwires, as (key, function) once each."""
    seen, out = set(), []
    for lab in labs.values():
        pairs = [pair for name, targets in lab.targets.items() if name in lab.functions for pair in targets]
        for obj, attr in [*pairs, *lab.tripwires]:
            raw = inspect.getattr_static(obj, attr)
            fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw
            key = f"{fn.__module__}:{fn.__qualname__}"
            if key not in seen:
                seen.add(key)
                out.append((key, fn))
    return out


def _anonymous(code: types.CodeType) -> types.CodeType:
    """The code object with no path of ours in it (nested code objects too)."""
    consts = tuple(_anonymous(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
    return code.replace(co_filename="<minivllm reference: compiled>", co_consts=consts)


def _call_args(fn) -> str:
    parts = []
    for p in inspect.signature(fn).parameters.values():
        parts.append({p.VAR_POSITIONAL: f"*{p.name}", p.VAR_KEYWORD: f"**{p.name}",
                      p.KEYWORD_ONLY: f"{p.name}={p.name}"}.get(p.kind, p.name))
    return ", ".join(parts)


def _stubbed(source: str, functions: list) -> str:
    """The module's source with each function's body (after its docstring) replaced by the call to its bytecode."""
    tree, lines = ast.parse(source), source.splitlines(keepends=True)
    edits = []
    for key, fn in functions:
        qualname = fn.__qualname__.split(".")
        node = _find(tree, qualname)
        body = node.body[1:] if ast.get_docstring(node) is not None else node.body
        first = body[0].lineno if body else node.end_lineno + 1
        indent = " " * body[0].col_offset if body else " " * (node.col_offset + 4)
        call = f"{indent}return _minivllm_labref({key!r})({_call_args(fn)})\n"
        edits.append((first - 1, node.end_lineno, call))
    for start, end, text in sorted(edits, reverse=True):
        lines[start:end] = [text]
    return "".join(lines) + "\n\nfrom minivllm._labref import reference as _minivllm_labref  # noqa: E402\n"


def _find(tree, qualname: list):
    scope = tree
    for name in qualname:
        scope = next(n for n in scope.body if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name == name)
    return scope


def release(dest, labs, exercises: Path, notebooks: Path | None) -> list[Path]:
    """Write the student edition into `dest` (see the module's docstring); return the files written at its top."""
    from minivllm.labs.handout import write_pages
    from minivllm.labs.student import stub_source, write_student_copies
    dest = Path(dest)
    if (dest / "minivllm").exists():
        raise ValueError(f"{dest / 'minivllm'} exists already: release into a new folder")
    shutil.copytree(_PACKAGE, dest / "minivllm", ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.so"))
    labs_dir = dest / "minivllm" / "labs"
    for path in labs_dir.glob("faults*.py"):
        path.unlink()
    for path in (labs_dir / "exercises").glob("lab*.py"):
        path.write_text(stub_source(path.read_text()))
    functions = lab_functions(labs)
    by_file: dict[Path, list] = {}
    for key, fn in functions:
        by_file.setdefault(Path(inspect.getsourcefile(fn)).resolve(), []).append((key, fn))
    for path, fns in by_file.items():
        target = dest / "minivllm" / path.relative_to(_PACKAGE)
        target.write_text(_stubbed(path.read_text(), fns))
    table = {key: (fn.__module__, _anonymous(fn.__code__), fn.__defaults__, fn.__kwdefaults__) for key, fn in functions}
    (dest / "minivllm" / "_labref.bin").write_bytes(marshal.dumps((tuple(sys.version_info[:2]), table)))
    (dest / "minivllm" / "_labref.py").write_text(_LABREF)
    project = (_PACKAGE.parent / "pyproject.toml").read_text()
    project = project.replace('"tracing/viewer/*"]', '"tracing/viewer/*", "_labref.bin"]')
    project = project.replace('readme = "README.md"\n', "")
    (dest / "pyproject.toml").write_text(project)
    written = [dest / "pyproject.toml", dest / "minivllm"]
    written += write_pages(dest, labs) + write_student_copies(dest, exercises, notebooks)
    (dest / "INSTALL.md").write_text(textwrap.dedent("""\
        # Installing the labs
        In this folder, with Python {v} and a virtual environment of your own:

            python -m pip install -e .
            python -m minivllm.labs list
            python -m minivllm.labs check 2 --submission exercises/lab02_preemption.py

        Write each lab in `exercises/`; `check N --all` runs every check of lab N, not only up to the first
        failure. The engine runs the reference of every lab you have not written yet.
        """).format(v=".".join(map(str, sys.version_info[:2]))))
    return [*written, dest / "INSTALL.md"]
