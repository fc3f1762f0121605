"""Mirror of vllm/utils/math_utils.py: integer helpers."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: how many blocks of b hold a items."""
    return -(-a // b)
