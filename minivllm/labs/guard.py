"""What a submission may not do: import the grader or the reference solution, or call the engine function it replaces.

Checked twice. Statically, on the file's syntax tree before anything runs (`static_refusal`): no import of
`minivllm.labs` (the grader, the checks, the reference solutions), no import or attribute of a name the lab
replaces (e.g. `Scheduler._preempt_request` in lab 2), no dynamic import (`importlib`, `__import__`,
`sys.modules`). At run time, in the grading process (`guarded_builtins`, `install_tripwires`,
`runtime_refusal`): the file's own imports go through a guarded `__import__`, the engine attributes the lab
replaces are tripwires while the file is imported (grabbing and calling one is refused), and each function the
lab asks for must be a function defined in the file itself.

This is a grader's guard, not a security sandbox: the submission runs as the same user as the grader.
"""
from __future__ import annotations

import ast
import builtins
import inspect
import sys
import types

REFUSED = "refused: "
_DYNAMIC = {"importlib", "runpy", "__import__"}
_LABREF = {"_labref", "_minivllm_labref"}


def forbidden_names(lab) -> set[str]:
    """The lab's own function names (the engine's versions of them) plus the engine functions that do the same."""
    return set(lab.functions) | set(lab.targets) | set(lab.forbidden)


def static_refusal(source: str, lab, filename: str = "<submission>") -> str | None:
    """Why the file is refused, read from its syntax tree without running it; None if it is acceptable."""
    try:
        tree = ast.parse(source, filename)
    except SyntaxError:
        return None  # the import reports the syntax error with its line
    names = forbidden_names(lab)
    for node in ast.walk(tree):
        line = getattr(node, "lineno", "?")
        if isinstance(node, ast.Import):
            for alias in node.names:
                if why := _module_refusal(alias.name):
                    return f"line {line}: `import {alias.name}`: {why}"
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            for alias in node.names:
                full = f"{module}.{alias.name}" if module else alias.name
                if why := _module_refusal(module) or _module_refusal(full):
                    return f"line {line}: `from {module} import {alias.name}`: {why}"
                if alias.name in names:
                    return (f"line {line}: `from {module} import {alias.name}`: {alias.name} is the engine's own "
                            f"function this lab asks you to write")
        elif isinstance(node, ast.Attribute) and node.attr in _LABREF or isinstance(node, ast.Name) and \
                node.id in _LABREF:
            return f"line {line}: `{getattr(node, 'attr', None) or node.id}`: {_module_refusal('_labref')}"
        elif isinstance(node, ast.Attribute) and node.attr in names:
            return (f"line {line}: `.{node.attr}`: that is the engine's own function this lab asks you to write; "
                    f"write it yourself")
        elif isinstance(node, ast.Attribute) and node.attr == "modules" and _is_name(node.value, "sys"):
            return f"line {line}: `sys.modules`: a lab file imports what it needs with a plain import"
        elif isinstance(node, ast.Name) and node.id in _DYNAMIC:
            return f"line {line}: `{node.id}`: a lab file imports what it needs with a plain import"
    return None


def _is_name(node, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _module_refusal(module: str) -> str | None:
    if module.split(".")[-1] in _LABREF:
        return "the compiled reference solutions (a student edition's _labref) are the grader's, not yours"
    if module == "minivllm.labs" or module.startswith("minivllm.labs."):
        return ("a submission may not import the labs package (the grader, its checks and the reference "
                "solutions live there)")
    if module.split(".")[0] in _DYNAMIC:
        return "a lab file imports what it needs with a plain import"
    return None


class ReferenceRefused(BaseException):
    """Raised by a tripwire: the submission called the engine's own version of a function it must write.
    A BaseException so that a submission's `except Exception` does not swallow it."""


def guarded_builtins(lab) -> dict:
    """The builtins a submission's module runs with: `__import__` refuses the labs package and the lab's names."""
    names = forbidden_names(lab)

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        why = _module_refusal(name) if level == 0 else None
        for item in fromlist or ():
            why = why or (_module_refusal(f"{name}.{item}") if level == 0 else None)
            if item in names:
                why = why or f"{item} is the engine's own function this lab asks you to write"
        if why:
            raise ImportError(f"{REFUSED}import {name}{' (' + ', '.join(fromlist) + ')' if fromlist else ''}: {why}")
        return builtins.__import__(name, globals, locals, fromlist, level)

    return {**vars(builtins), "__import__": guarded_import}


def install_tripwires(lab, tripped: list) -> None:
    """Replace, in this process only, every engine attribute the lab's functions replace by a tripwire.

    The checks then patch the submission's own functions over them, so a tripwire fires only when the
    submission grabbed the engine's function at import time and calls it.
    """
    for name, targets in lab.targets.items():
        if name not in lab.functions:
            continue  # an engine function the student does not write (a fault may replace it): the engine calls it
        for obj, attr in targets:
            _set_tripwire(obj, attr, name, tripped)
    for obj, attr in lab.tripwires:
        _set_tripwire(obj, attr, attr, tripped)


def _set_tripwire(obj, attr: str, name: str, tripped: list) -> None:
    """A staticmethod stays a staticmethod (lab 13's OutputProcessor._check_stop_strings): the checks then patch
    the submission's function in as one, and the engine calls it without self."""
    wire = _tripwire(name, tripped)
    static = isinstance(inspect.getattr_static(obj, attr, None), staticmethod)
    setattr(obj, attr, staticmethod(wire) if static else wire)


def _tripwire(name: str, tripped: list):
    def tripwire(*args, **kwargs):
        tripped.append(name)
        raise ReferenceRefused(f"{REFUSED}your code called the engine's own {name}: write it yourself")
    return tripwire


def runtime_refusal(lab, functions: dict, filename: str, tripped: list) -> str | None:
    """Why the loaded submission is refused at run time; None if it is acceptable."""
    if tripped:
        return f"your code called the engine's own {tripped[0]}: write it yourself"
    if any(m == "minivllm.labs.exercises" or m.startswith("minivllm.labs.exercises.") for m in sys.modules):
        return "the reference solutions were imported while your file ran"
    for name in lab.functions:
        fn = functions.get(name)
        if not isinstance(fn, types.FunctionType):
            return f"{name} must be a function defined in your file (def {name}(...)), not {type(fn).__name__}"
        if fn.__code__.co_filename != filename:
            return (f"{name} must be defined in your file (def {name}(...)); yours comes from "
                    f"{fn.__code__.co_filename}")
    return None
