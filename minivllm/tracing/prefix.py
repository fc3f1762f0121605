"""Prefix-cache hits in a trace: which blocks a newly admitted or resumed request shares, and with whom.

A request admitted with num_computed_tokens > 0 found that many prompt tokens in the prefix cache: its
first num_computed_tokens // block_size blocks are cache hits. A hit block held by other requests too
has ref_cnt = 1 + their number; here that is read off the step's block tables, e.g. with 16-token blocks
"1 admitted ... after 32 found" gives "1 prefix-cache hit: blocks [1, 2] (tokens 0..31), shared with 0:
ref_cnt 2, 2". Requests not scheduled this step are not in the block tables, so a block one of them holds
counts one short: the trace records only what the step scheduled. A request resumed after a preemption
looks the prefix cache up again (its num_computed_tokens went to 0 when preempted): the full blocks it
had computed, freed but still cached, come back as hits unless they were evicted meanwhile.
"""
from __future__ import annotations

from minivllm.tracing.text import atom, fmt_list


def prefix_hit_notes(sched: dict, block_size: int) -> list[str]:
    """One line per request admitted or resumed this step with a prefix-cache hit; [] when none hit."""
    tables, notes = sched.get("block_tables", {}), []
    # (request, num_computed_tokens, its block ids, when): admitted now, or resumed after a preemption
    looked_up = [(n["req_id"], n["num_computed_tokens"], n["block_ids"], "") for n in sched["scheduled_new_reqs"]]
    cached = sched["scheduled_cached_reqs"]
    looked_up += [(r, computed, tables.get(r, []), " on resume") for r, resumed, computed in
                  zip(cached["req_ids"], cached["resumed_from_preemption"], cached["num_computed_tokens"]) if resumed]
    for req_id, computed, block_ids, when in looked_up:
        num_hit_blocks = computed // block_size
        if num_hit_blocks == 0:
            continue
        hits = block_ids[:num_hit_blocks]
        others = [r for r, row in tables.items() if r != req_id and set(row) & set(hits)]
        ref_cnts = [1 + sum(b in tables[r] for r in others) for b in hits]
        whom = f"shared with {atom(fmt_list(others))}" if others else "free cached blocks taken back (touch)"
        notes.append(f"{req_id} prefix-cache hit{when}: blocks {atom(fmt_list(hits))} (tokens "
                     f"0..{num_hit_blocks * block_size - 1}), {whom}: ref_cnt {atom(fmt_list(ref_cnts))}")
    return notes
