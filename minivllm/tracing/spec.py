"""Speculative decoding in a trace: the drafts a step verified, what the target model said at each draft
position, how many drafts were accepted, and how far update_from_output rolled num_computed_tokens back.

A request carrying d drafts is packed as d + 1 rows: its last sampled token, then the drafts. Row j's logits
are the target's choice for the token after row j, so the drafts are checked in order; the first mismatch
replaces the draft with the target's token, and if all d match the last row gives a bonus token. E.g. drafts
[' the', ' cat', ' sat'] with target tokens [' the', ' cat', ' ran', ...] keep ' the', ' cat' and the
target's ' ran' (3 tokens), and the one rejected draft position is rolled back.
"""
from __future__ import annotations

from typing import Callable

from minivllm.tracing.text import atom, fmt_list


def _words(tokens: list[int], decode: Callable) -> str:
    return atom(repr("".join(decode(t) for t in tokens)))


def verify_lines(execute: dict, update: dict, decode: Callable) -> list[str]:
    """One line per request that carried drafts this step: rows, drafts, target tokens, accepted, rollback."""
    spec_decode = update.get("spec_decode", {})
    if not spec_decode or execute is None:
        return []
    b = execute["batch"]
    index = {r: i for i, r in enumerate(b["req_ids"])}
    lines = []
    for req_id, spec in spec_decode.items():
        drafts, kept = spec["draft_token_ids"], spec["sampled_token_ids"]
        last_row = b["query_start_loc"][index[req_id] + 1] - 1
        first_row = last_row - len(drafts)
        computed = b["positions"][last_row] + 1  # num_computed_tokens once the step's tokens count as computed
        ending = "bonus" if spec["num_rejected"] == 0 else "the target's, in place of a rejected draft"
        lines.append(f"{req_id}: rows {first_row}..{last_row} verify drafts {_words(drafts, decode)} "
                     f"{atom(fmt_list(drafts, 8))} at positions {computed - len(drafts)}..{computed - 1}; "
                     f"accepted {spec['num_accepted']} of {len(drafts)}, kept {_words(kept, decode)} "
                     f"(last token: {ending}); rolled back {spec['num_rejected']}: num_computed_tokens {computed} "
                     f"-> {computed - spec['num_rejected']}")
    return lines


def step_token(req_id: str, n: int, new_token_ids: list[int] | None, spec: dict | None, decode: Callable) -> str:
    """`req:token` for a one-line step; with drafts `req:[1+d drafts, a accepted]->'text'`, a chunk `[n tokens]`."""
    text = _words(new_token_ids, decode) if new_token_ids else ""
    if spec is not None:
        head = f"[1+{len(spec['draft_token_ids'])} drafts, {spec['num_accepted']} accepted]"
    else:
        head = f"[{n} tokens]" if n > 1 else ""
        text = f"{decode(new_token_ids[0])!r}" if new_token_ids else ""
    return atom(f"{req_id}:{head}{'->' if head and text else ''}{text}")


def draft_notes(update: dict, focus: str) -> list[str]:
    """A step where the followed request verified drafts prints in full; this is its headline."""
    spec = update.get("spec_decode", {}).get(focus)
    if spec is None:
        return []
    d = len(spec["draft_token_ids"])
    return [f"{focus} verifies {d} draft{'s' * (d != 1)} (proposed from its own tokens after the last "
            f"step): {spec['num_accepted']} accepted, {spec['num_rejected']} rolled back"]
