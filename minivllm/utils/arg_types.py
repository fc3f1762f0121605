"""How an engine argument's type is read from EngineConfig's annotations and checked (config.py uses it).

A bool is no int and a string is no number, as in vLLM's argument parsing; checked before anything is loaded
so a typo never costs a model load.
"""
from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Literal

from minivllm.utils.math_utils import is_int, is_number

_INT, _FLOAT, _BOOL, _STR, _DICT = "an int", "a finite number", "True or False", "a string", "a dict"


def unwrap_optional(hint) -> tuple[object, bool]:
    """`int | None` -> (int, True), `int` -> (int, False): a field's type and whether None is allowed."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        return next(t for t in typing.get_args(hint) if t is not type(None)), type(None) in typing.get_args(hint)
    return hint, False


@functools.lru_cache(maxsize=None)
def field_kinds(cls: type) -> dict[str, tuple[str, bool]]:
    """{field: (kind, optional)} read from the dataclass's annotations: the annotation is the one statement
    of each argument's type. A Literal's kind is its values' type (all strings here)."""
    hints, kinds = typing.get_type_hints(cls), {}
    for field in dataclasses.fields(cls):
        hint, optional = unwrap_optional(hints[field.name])
        if typing.get_origin(hint) is Literal:
            hint = type(typing.get_args(hint)[0])
        kinds[field.name] = ({int: _INT, float: _FLOAT, bool: _BOOL, str: _STR, dict: _DICT}[hint], optional)
    return kinds


def check_type(name: str, value, kind: str, optional: bool = False) -> None:
    if value is None and optional:
        return
    ok = {_INT: is_int, _FLOAT: is_number, _BOOL: lambda v: isinstance(v, bool),
          _STR: lambda v: isinstance(v, str), _DICT: lambda v: isinstance(v, dict)}[kind](value)
    if not ok:
        raise ValueError(f"Engine argument {name} must be {kind}{' or None' if optional else ''}, "
                         f"got {value!r} ({type(value).__name__}).")
