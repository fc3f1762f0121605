"""Plain-text pieces of the trace's layout: glued atoms, shortened lists, clipped strings."""
from __future__ import annotations

NBSP = "\xa0"  # textwrap never breaks here: keeps "0:' the'" or "block_table[3, 1]" on one line


def atom(text: str) -> str:
    """Glue a piece so wrapping never splits it."""
    return text.replace(" ", NBSP)


def fmt_list(values, limit: int = 20) -> str:
    """[1, 2, 3] in full up to `limit` items, else the head, "…", the tail and the count."""
    values = list(values)
    if len(values) <= limit:
        return "[" + ", ".join(map(str, values)) + "]"
    head, tail = values[:limit - 4], values[-3:]
    return "[" + ", ".join(map(str, head)) + ", …, " + ", ".join(map(str, tail)) + f"] (n={len(values)})"


def clip(text: str, room: int) -> str:
    """repr(text) in at most `room` characters: if it does not fit, cut at a word and mark the cut.

    E.g. clip(" the cache needs to", 16) -> "' the cache'…" (the quote closes where the text was cut).
    """
    if len(repr(text)) <= room:
        return repr(text)
    keep = text
    while keep and len(repr(keep)) + 1 > room:
        keep = keep[:-1]
    space = keep.rfind(" ")
    if space > len(keep) // 2:
        keep = keep[:space]
    return repr(keep) + "…"
