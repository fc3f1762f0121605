"""The handout's pages: one per lab (goal, how to run and check, what the checks prove, the edge case, the
time it takes) and an index. `python -m minivllm.labs student DIR` writes them with the stubs and notebooks.

What each check proves is written here once per check name; `pages_for` refuses a lab whose check has no
description (tests/test_labs_handout.py runs it for every lab), so a new check cannot ship undocumented.
"""
from __future__ import annotations

from pathlib import Path

# lab id -> (goal, the edge case to think about)
LAB_TEXT = {
    1: ("Drive the engine the way LLM.generate does: submit every prompt, step until nothing is unfinished, "
        "return one finished output per prompt, in the order of the prompts.",
        "Requests finish in any order, and a prefill split into chunks takes several steps: nothing you know "
        "before the loop (number of prompts, max_tokens) tells you how many steps it takes."),
    2: ("Preempt a running request by recompute: free its KV blocks so others can run, forget its progress, and "
        "put it first in line to come back.",
        "The victim may share its first blocks with another running request (a prefix-cache hit): those stay "
        "held. The order blocks return to the free queue is the order they will be evicted."),
    3: ("Lay one step's scheduled tokens, from every request, on one dimension: each row's request, position "
        "and KV slot, and the rows whose logits sample the next tokens.",
        "A request in the middle of a chunked prefill does not sample; a decode row sits after the whole history; "
        "block sizes other than 4."),
    4: ("Give each attention layer what it needs from the forward context: the step's metadata, the layer, its "
        "own KV cache and slot_mapping.",
        "Every step installs a new forward context; every layer has its own cache."),
    5: ("Write K/V into the paged cache by slot_mapping and read a request's history back by its block table.",
        "Padding slots (-1); block ids in any order; block sizes other than 4."),
    6: ("Decide when a request stops (check_stop) and reclaim a finished request (_free_request).",
        "EOS as the last allowed token (which reason wins?), the max_model_len boundary, min_tokens, and a "
        "finished request sharing its prefix blocks with one still running."),
    7: ("Name a full KV block by its tokens and its whole prefix: the chained sha256 the lab specifies.",
        "The same block after another prefix, or the same blocks in another order, must not hit; the same "
        "prompt again must hit, in any process."),
    8: ("Mask the logits outside top-k, then outside the top-p nucleus.",
        "k <= 0 means no limit; the token whose probability mass reaches top_p stays; both set at once."),
    9: ("Decide how many of a request's draft tokens the target model keeps: the longest prefix it agrees with, "
        "then one token of its own, so speculation changes how fast tokens come, never which.",
        "A rejected draft ends the request's tokens (no bonus after it); a request without drafts in the same "
        "batch; a random row's replacement comes from p without the draft, and its random numbers from the "
        "request's own generator."),
    10: ("Propose drafts by prompt lookup: find the longest suffix n-gram that occurred earlier in the request, "
         "and copy what followed its first occurrence.",
         "The suffix itself is not an earlier occurrence; a longer n wins over an earlier shorter one; the "
         "continuation may be shorter than k, and the request must not grow past max_model_len."),
    11: ("Decide how many tokens a request gets in one step: a decode, its drafts, a prefill chunk or a whole "
         "prompt, within the step's budget and the model's length.",
         "Drafts count for a running request only; without chunked prefill a prompt comes in whole or waits; the "
         "last position a request can reach is never scheduled."),
    12: ("Find how much of a waiting request's prompt the prefix cache already holds: the longest run of its "
         "block hashes that hit, in whole blocks, without taking anything.",
         "A cached block after a miss is of no use; a prompt cached whole still runs its last token; a request "
         "asking for prompt logprobs reads nothing; the hits are touched later, by allocate_slots."),
    13: ("Stop a request on a stop string in its incrementally decoded text, and cut the text there.",
         "A stop string that starts in the previous step's characters; an older match that no longer counts; "
         "several stop strings (list order wins); include_stop_str_in_output."),
    14: ("Write the row-parallel linear layer of tensor parallelism: each rank loads its columns of the weight, "
         "multiplies its slice of the input, and the partial sums are all-reduced, the bias counted once.",
         "Which dimension is cut and which rank gets which slice; the bias on one rank only; reduce_results "
         "off; tp_size 1."),
}

# check name -> what passing it proves
PROVES = {
    "greedy tokens = LLM.generate": "your loop returns the same tokens as LLM.generate for two prompts",
    "outputs in prompt order": "outputs come back in prompt order even when the second prompt finishes first",
    "chunked tokens = LLM.generate": "your loop still finishes every request when prefill is chunked (budget 4)",
    "preemption: victim state and counters": "status, progress, both preemption counters, registration and the "
    "victim's place in WAITING, at block sizes 4, 8 and 16 with odd prompt lengths",
    "preemption: shared blocks and free order": "shared prefix blocks stay held, the victim's own blocks return "
    "tail first, and its full blocks stay cached (its readmission hits them)",
    "victim state": "in the real engine, the victim's blocks come back and it is readmitted and finishes",
    "preempted tokens and victims = reference": "12 blocks for 4 requests: the same victims and tokens as the "
    "engine's, every invariant after every step (ref_cnts, free + held = pool, queues)",
    "chunked and preempted tokens = reference": "the same under a token budget of 6 (chunks and preemption at once)",
    "indices = formula": "all six arrays on hand-made batches (decodes, a middle chunk, a new prompt) at block "
    "sizes 4, 8 and 16",
    "greedy tokens = reference": "the engine with your function gives the reference tokens, every invariant held",
    "chunked tokens = reference": "the same with prefill in chunks of 4 tokens",
    "context of the named layer": "each of three layers gets its own objects, in two successive steps",
    "write and read = formula": "the write and the read on hand-made caches at block sizes 4, 8 and 16, padding "
    "included",
    "preempted tokens = reference": "the same with preemption (freed blocks reused by others)",
    "stop check: every rule and boundary": "14 cases: EOS, ignore_eos, min_tokens, stop_token_ids, max_tokens and "
    "max_model_len at and one short of their boundary, EOS as the last allowed token",
    "free: request forgotten, runner told": "the request leaves scheduler.requests, its id reaches "
    "finished_req_ids (the runner releases its row) and it holds no block",
    "free: shared blocks, free order, later hits": "shared blocks stay held, own blocks return tail first, and "
    "a later request with the same prompt still hits its prefix after the pool evicts",
    "EOS tokens = reference": "a request that ends with EOS beside one that runs to max_tokens",
    "digest = the specified sha256": "the exact digest, block by block, on chains at block sizes 4, 8 and 16",
    "hash is chained, in order": "the parent enters the digest, the order of blocks counts, the hash is stable",
    "shared suffix, different prefix: no hit": "in the engine, a block after another prefix is not a hit",
    "blocks in another order: no hit": "in the engine, blocks X, Y then Y, X is not a hit",
    "same prompt again: a hit": "in the engine, the same prompt again hits its cached blocks",
    "masks = formula": "the kept tokens of every row for top-k alone, top-p alone and both",
    "seeded sampled tokens = reference": "seeded sampling in the engine gives the reference tokens",
    "greedy: kept prefix, then the target token": "batches of 1 to 4 requests, 1 to 7 drafts, vocabularies of "
    "10 to 1000 tokens: drafts kept up to the first that differs from its row's argmax, then that argmax, nothing "
    "after it",
    "greedy: the bonus after every kept draft": "every draft kept gives the bonus token too; a request without "
    "drafts, between requests with drafts, gets its bonus token alone",
    "random: the target distribution": "3000 seeded requests with two drafts on vocabularies of 5 and 7 (one "
    "with temperature 0.7 and top-k 5): the first token, the second after a kept draft and the number of tokens "
    "follow the target's p (chi-square, p-value 1e-6)",
    "random: every request on its own generator": "40 seeded requests give the same tokens in a batch and in the "
    "reverse order (each draws from its own generator); greedy rows beside them stay greedy",
    "random: the exact random stream of each request": "the same seeded batch, and 40 unseeded requests sharing one "
    "generator (greedy and random alternating): every request's tokens equal the engine's exactly",
    "n-gram speculation: greedy tokens = reference": "in the engine with n-gram drafts (4 per step), the reference "
    "tokens and the same numbers of drafts accepted at each position",
    "drafts: the longest n-gram, first match": "six cases, n-gram ranges 1-1 to 3-5 and k 1 to 8: the longest "
    "suffix that occurred earlier, its first occurrence, the tokens right after it",
    "drafts: at most k, never past max_model_len": "k, max_model_len at 2, 1 and 0 tokens away, a continuation "
    "shorter than k, no match, sequences too short to match",
    "generated sequences = reference": "300 random sequences on small vocabularies (many matches), random n-gram "
    "ranges, k and max_model_len",
    "n-gram speculation: drafts and tokens = reference": "in the engine, two requests running to max_model_len "
    "(64): the drafts proposed after each step and the tokens equal the reference's",
    "running: drafts, budget, max_model_len": "decodes with and without drafts, prefill chunks at budgets 4, 8 and "
    "16, a threshold, max_model_len one and two positions away",
    "admission: the hit, threshold, whole or nothing": "prompts after a prefix-cache hit, longer than the budget, "
    "under a threshold, without chunked prefill (fits, does not fit, a threshold set), readmitted after preemption",
    "chunked under a threshold: schedule = reference": "in the engine (budget 12, threshold 5, drafts), the tokens "
    "scheduled for each request at each step and the tokens equal the reference's",
    "no chunked prefill: schedule = reference": "the same without chunked prefill (budget 12, a threshold of 4 "
    "it must ignore): the third prompt waits, then comes in whole",
    "no chunked prefill, an exact fit: schedule = reference": "prompts of 4 and 8 tokens in a budget of 12 without "
    "chunked prefill: the second fills the budget exactly and comes in the same step",
    "up to max_model_len: schedule = reference": "the same with requests running to max_model_len (64) with drafts, "
    "and a preemption",
    "lookup: the longest cached prefix, capped": "7 cases at block sizes 4, 8 and 16: prompts cached whole (a "
    "multiple of block_size or not), a hole after block 0, block 0 evicted, a prompt shorter than a block, a "
    "request asking for prompt logprobs: the same blocks and tokens as the engine's",
    "lookup: nothing taken, the pool unchanged": "after each lookup every ref_cnt, the free queue's order and the "
    "cached blocks are as before it",
    "stop strings: the window, the order, the cut": "12 texts: a stop string across the old and new characters, "
    "an older match, two stop strings in another order, twice in the new text, kept or not, no new text, the "
    "window's first position, a whole text new",
    "in the engine: stopped text = reference": "two greedy requests stopped by strings around a token boundary "
    "(one kept): the same text, finish and stop reasons and number of tokens as the engine's",
    "weight_loader: each rank its columns": "tp_size 1, 2 and 4 simulated by threads: every rank's weight and bias "
    "loaded from the full tensors, square and odd shapes",
    "local_bias: the bias once": "every rank's local_bias(), with and without a bias",
    "forward: partial sums, all-reduced": "every rank's output after the all-reduce equals the full X W^T + b, "
    "and the partial sum when reduce_results is off",
    "forward: the collectives each rank performs": "every rank's all-reduces (and their shapes), in "
    "order, are the engine's: one all-reduce of the whole output, none at tp_size 1 or with reduce_results off",
    "preempted: schedule, blocks and tokens = reference": "with preemption: the tokens scheduled for each request "
    "at each step, the blocks each holds after it (a readmitted request reuses its blocks still cached) and the "
    "tokens equal the reference's",
}


def pages_for(lab) -> str:
    """The page of one lab (markdown)."""
    missing = [name for name, *_ in lab.checks if name not in PROVES]
    if missing:
        raise ValueError(f"lab {lab.id}'s checks {missing} have no description: add them to handout.PROVES")
    goal, edge = LAB_TEXT[lab.id]
    checks = "\n".join(f"{i}. **{name}**: {PROVES[name]}." for i, (name, *_) in enumerate(lab.checks, 1))
    return f"""# Lab {lab.id}: {lab.title}

**Goal.** {goal}

**Write** {', '.join(f'`{f}`' for f in lab.functions)} in `exercises/{lab.module}.py`. The docstrings are the
contract: inputs, outputs, the invariants the grader checks, one worked example. Keep the `def` lines as they are.

**Run and check.**

```bash
python -m minivllm.labs check {lab.id} --submission exercises/{lab.module}.py        # stops at the first failure
python -m minivllm.labs check {lab.id} --submission exercises/{lab.module}.py --all  # every check
```

A failed check prints where (case, step, request, field), what the engine gives, what yours gave, and a hint.
The unit checks run first, without the model, in about a second; the checks in the engine take a few seconds
each (the first `check` of a session also loads the model and computes the reference once).

**What the checks prove.**

{checks}

**The edge case to think about.** {edge}

**Expected time.** About {lab.minutes} minutes.
"""


def write_pages(dest, labs: dict) -> list[Path]:
    """Write dest/README.md (the index) and dest/labs/labNN.md; return the files written."""
    dest = Path(dest)
    (dest / "labs").mkdir(parents=True, exist_ok=True)
    written = []
    for lab in labs.values():
        path = dest / "labs" / f"lab{lab.id:02d}.md"
        path.write_text(pages_for(lab))
        written.append(path)
    rows = "\n".join(f"| {lab.id} | [{lab.title}](labs/lab{lab.id:02d}.md) | `exercises/{lab.module}.py` | "
                     f"{lab.minutes} min |" for lab in labs.values())
    index = dest / "README.md"
    index.write_text(f"""# minivllm labs: the handout

Each lab asks you to write one mechanism of the engine. The grader plugs your function into the real engine in
place of ours and checks it: first on small hand-made cases, then in the engine against the reference.

| lab | what you write | file | time |
|---|---|---|---|
{rows}

Start a lab by reading its page, then the docstring of the function in its file. Check with
`python -m minivllm.labs check N --submission exercises/<file>.py`. The notebooks in `notebooks/` end with a
Predict lab: set `MY_ANSWER`, run the check cell, then write down why in the cell after it.
""")
    return [index, *written]
