"""Mirror of vllm/utils/math_utils.py: integer helpers, and the strict number checks every validator shares."""
from __future__ import annotations

import math


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of b hold a items."""
    return -(-a // b)


def is_int(value) -> bool:
    """An int that is not a bool (True is no token id, no count, no size)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
    """A finite int or float, not a bool: NaN and infinities are refused wherever a number is due."""
    return (is_int(value) or isinstance(value, float)) and math.isfinite(value)
