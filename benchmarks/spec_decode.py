"""N-gram speculative decoding: the same workloads with speculation off and on, side by side.

Two workloads. Grounded: N chat prompts, each holding a short passage and asking the model to repeat it, to
fix the typos planted in it, or to continue its opening word for word; greedy, up to --output-len tokens,
stopping at EOS, so the output tokens are counted, not assumed. Random: the 32-request workload of
benchmarks/throughput.py (random-token prompts, random max_tokens, ignore_eos, seed 0): nothing in a prompt is
worth copying, so the drafts come only from the model repeating itself (a small model on noise often loops).
Both engines (speculation off, and on with vLLM's speculative_config {"method": "ngram", ...}) are built once
and warmed up, then measured in alternating order (off on, on off, ...); the prefix cache is reset before every
run. Every round prints output tok/s of both, their ratio, the
acceptance rate (accepted / draft tokens), the mean acceptance length (1 + accepted / drafts) and the
acceptance rate at each draft position; then the median ratio per workload and whether the greedy tokens of
both engines are identical (in float32 they must be: main returns 1 if not; in bfloat16 a verify pass of k+1
rows rounds a little differently from a one-row decode, so a near tie can flip, and the count is reported). Expected: a clear
gain on the grounded workload, none lost beyond noise on the random one. On a small CPU a batch of 16-32 requests
already keeps the cores busy, so a step that verifies k+1 tokens per request costs nearly k+1 plain steps and
the gain stays well below the mean acceptance length; speculation pays most where a step is bound by reading
the weights (few requests at a time, a GPU).

    python benchmarks/spec_decode.py                                # SmolLM2-135M, bf16, k=4, 2 rounds
    python benchmarks/spec_decode.py --num-speculative-tokens 2 --dtype float32
    python benchmarks/spec_decode.py --quick                        # a smoke test, not a measurement
"""
from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("MINIVLLM_LOGGING_LEVEL", "WARNING")

import results  # noqa: E402
import throughput  # noqa: E402

PASSAGES = [
    "A cache keeps a copy of data close to where it is needed, so that the second request for the same item is "
    "answered quickly. The hard part is not storing things but deciding what to throw away. When the cache is "
    "full, something must leave, and a poor choice means the next request goes all the way back to the slow "
    "source. Many systems evict whatever was used least recently, because the recent past is often a fair guide "
    "to the near future.",
    "The night train left the coast a little after ten. Most passengers folded their coats into pillows and "
    "slept, but an old man by the window kept watching the dark fields go past. At every small station he "
    "counted the lamps on the platform and wrote the number in a notebook. When the conductor asked him why, he "
    "said that his father had done the same on this line fifty years ago, and he wanted to know what had changed.",
    "A vegetable garden rewards patience more than effort. Seeds sown too early rot in cold soil, and those sown "
    "too late never ripen before the first frost. Good gardeners watch the weather, feed the ground with compost "
    "every autumn and move their crops to a new bed each year, so that pests lose track of them. In return the "
    "garden gives beans in summer, squash in the autumn and a long list of lessons for the following spring.",
    "Bread needs only flour, water, salt and yeast, yet no two loaves are quite the same. The temperature of the "
    "kitchen changes how fast the dough rises, and the flour itself absorbs more or less water from one bag to "
    "the next. An experienced baker learns to judge the dough by touch rather than by the clock. She presses it "
    "gently with a finger, and if the dent slowly springs back, the loaf is ready for the oven.",
    "Lighthouses were built to warn ships away from rocks that could not be seen at night. Each one flashes in "
    "its own pattern, so that a sailor who counts the seconds between flashes can tell which coast he is "
    "passing. For many years a keeper lived in every tower, trimming the wick and winding the clockwork that "
    "turned the lens. Today most lights run on their own, and the keepers' cottages have become small museums.",
    "A good map leaves most things out. If it showed every tree, fence and puddle, no one could find the road "
    "through all the detail. The mapmaker chooses what matters for the reader: a hiker wants paths and contour "
    "lines, while a driver wants junctions and the names of towns. The same valley can therefore appear on two "
    "maps that look almost nothing alike, and both of them can be perfectly accurate.",
    "Honeybees tell one another where to find food by dancing. A forager that returns to the hive with news of "
    "flowers walks a short straight line while shaking her body, then circles back and repeats it. The angle of "
    "that line against the vertical gives the direction of the flowers relative to the sun, and the length of "
    "the shaking run tells the other bees how far away they are. Within minutes, dozens of workers set off.",
    "The first computers filled whole rooms and were programmed by plugging cables into panels. Changing the "
    "program could take days, and a single loose wire was enough to spoil a calculation. Storing the program in "
    "memory, next to the data it worked on, changed everything: a new task now meant loading new instructions "
    "instead of rewiring the machine. Almost every computer built since then follows the same basic design.",
]
TASKS = ("repeat", "correct", "continue")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-requests", type=int, default=16, help="grounded requests (default: 16)")
    p.add_argument("--output-len", type=int, default=128, help="max_tokens of a grounded request (default: 128)")
    p.add_argument("--num-speculative-tokens", type=int, default=4, help="k, drafts per step (default: 4)")
    p.add_argument("--prompt-lookup-max", type=int, default=4, help="longest n-gram looked up (default: 4)")
    p.add_argument("--prompt-lookup-min", type=int, default=2,
                   help="shortest n-gram looked up (default: 2; 1 drafts more often, and more drafts are rejected)")
    p.add_argument("--model", default=None, help="model folder / .gguf (default: SmolLM2-135M-Instruct)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default="bfloat16", help="float32 or bfloat16 (default: bfloat16)")
    p.add_argument("--max-num-seqs", type=int, default=256,
                   help="requests in flight at once (vLLM's default 256: every request of a workload at once; "
                        "4 is a few users of a CPU box)")
    p.add_argument("--rounds", type=int, default=2, help="measured runs per engine, after a warm-up (default: 2)")
    p.add_argument("--seed", type=int, default=0, help="typo and random-workload seed (default: 0)")
    p.add_argument("--quick", action="store_true",
                   help="3 grounded and 4 random requests, a few tokens, 1 round: a smoke test, not a measurement")
    results.add_arguments(p)
    args = p.parse_args(argv)
    random_args = ["--seed", str(args.seed)]
    if args.quick:
        args.num_requests, args.output_len, args.rounds = 3, 8, 1
        random_args += ["--num-requests", "4", "--max-input", "32", "--min-output", "4", "--max-output", "8"]
    args.random = throughput.parse_args(random_args)
    return args


def add_typos(text: str, rng: random.Random, count: int = 4) -> str:
    """Swap two letters inside `count` of the longer words: plain typos a reader fixes without thinking."""
    words = text.split(" ")
    for i in rng.sample([i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()], count):
        w, j = words[i], rng.randrange(1, len(words[i]) - 2)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:]
    return " ".join(words)


def grounded_requests(n: int, seed: int) -> list[str]:
    """The user message of each grounded request: passage i mod 8, task i mod 3 (16 distinct pairs)."""
    rng = random.Random(seed)
    messages = []
    for i in range(n):
        passage, task = PASSAGES[i % len(PASSAGES)], TASKS[i % len(TASKS)]
        if task == "repeat":
            messages.append(f"Repeat the following passage word for word, with nothing before or after it.\n\n"
                            f"{passage}")
        elif task == "correct":
            messages.append(f"The passage below has a few spelling mistakes. Write it out again with the mistakes "
                            f"fixed and every other word unchanged.\n\n{add_typos(passage, rng)}")
        else:
            opening = ". ".join(passage.split(". ")[:2]) + "."
            messages.append(f"Here is a passage:\n\n{passage}\n\nContinue the text below exactly as the passage "
                            f"goes on, word for word.\n\n{opening}")
    return messages


def encode_chat(tokenizer, messages: list[str]) -> list[list[int]]:
    """Token ids of each message as a one-turn chat (the tokenizer's template), plain text without one."""
    if not tokenizer.chat_template:
        return [tokenizer.encode(m) for m in messages]
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": m}], add_generation_prompt=True,
                                           tokenize=False) for m in messages]
    return [tokenizer.encode(t, add_special_tokens=False) for t in texts]


SPEC_KEYS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def run_once(llm, prompts, params) -> tuple[float, list[list[int]], dict | None]:
    """One cold run (prefix cache reset): wall s, the output tokens per request, the spec-decode counters' deltas."""
    assert llm.reset_prefix_cache(), "the engine is idle: the reset cannot be refused"
    before = llm.llm_engine.get_stats()
    start = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - start
    after = llm.llm_engine.get_stats()
    spec = None
    if "spec_decode_num_drafts" in after:
        spec = {key: after[f"spec_decode_{key}"] - before[f"spec_decode_{key}"] for key in SPEC_KEYS}
        spec["per_pos"] = [a - b for a, b in zip(after["spec_decode_num_accepted_tokens_per_pos"],
                                                 before["spec_decode_num_accepted_tokens_per_pos"])]
    return wall, [list(o.outputs[0].token_ids) for o in outs], spec


def describe_spec(spec: dict) -> str:
    drafts, draft_tokens, accepted = spec["num_drafts"], spec["num_draft_tokens"], spec["num_accepted_tokens"]
    rate = accepted / draft_tokens if draft_tokens else 0.0
    length = 1 + accepted / drafts if drafts else 1.0
    per_pos = " ".join(f"{a / drafts:.2f}" if drafts else "-" for a in spec["per_pos"])
    return (f"acceptance rate {rate:.1%} ({accepted} of {draft_tokens} draft tokens, {drafts} drafts), "
            f"mean acceptance length {length:.2f}, accepted per position {per_pos}")


def main(argv=None) -> int:
    args = parse_args(argv)
    from transformers import AutoConfig, AutoTokenizer
    from minivllm import LLM, SamplingParams
    from minivllm.models.loader import resolve_model
    folder = resolve_model(args.model)
    grounded = encode_chat(AutoTokenizer.from_pretrained(folder), grounded_requests(args.num_requests, args.seed))
    random_prompts, random_max = throughput.make_workload(args.random, AutoConfig.from_pretrained(folder).vocab_size)
    workloads = {
        "grounded": (grounded, SamplingParams(temperature=0, max_tokens=args.output_len)),
        "random": (random_prompts, [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in random_max]),
    }
    max_model_len = max(max(map(len, grounded)) + args.output_len, args.random.max_input + args.random.max_output)
    spec_config = {"method": "ngram", "num_speculative_tokens": args.num_speculative_tokens,
                   "prompt_lookup_max": args.prompt_lookup_max, "prompt_lookup_min": args.prompt_lookup_min}
    print(f"grounded: {len(grounded)} chat prompts of {min(map(len, grounded))}-{max(map(len, grounded))} tokens, "
          f"greedy, up to {args.output_len} tokens (EOS stops); random: {len(random_prompts)} prompts of "
          f"{min(map(len, random_prompts))}-{max(map(len, random_prompts))} tokens, max_tokens "
          f"{min(random_max)}-{max(random_max)}, ignore_eos; {args.dtype}, max_num_seqs {args.max_num_seqs}, speculation {spec_config}", flush=True)
    engines = {}
    for on in (False, True):
        start = time.perf_counter()
        engines[on] = LLM(str(folder), device=args.device, dtype=args.dtype, max_model_len=max_model_len,
                          max_num_seqs=args.max_num_seqs, speculative_config=spec_config if on else None)
        for prompts, params in workloads.values():  # warm-up: a few short requests of each workload
            engines[on].generate(prompts[:2], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
        print(f"speculation {'on' if on else 'off'}: engine ready and warm in {time.perf_counter() - start:.1f} s",
              flush=True)
    ratios = {name: [] for name in workloads}
    outputs = {name: {} for name in workloads}
    per_round, summary = [], {}
    for r in range(args.rounds):
        for name, (prompts, params) in workloads.items():
            runs = {}
            for on in ((False, True) if r % 2 == 0 else (True, False)):
                wall, tokens, spec = run_once(engines[on], prompts, params)
                runs[on] = (wall, sum(map(len, tokens)) / wall, spec)
                outputs[name][on] = tokens
            ratios[name].append(runs[True][1] / runs[False][1])
            spec = runs[True][2]
            per_round.append({"round": r + 1, "workload": name, "off s": runs[False][0], "off tok/s": runs[False][1],
                              "on s": runs[True][0], "on tok/s": runs[True][1], "on / off": ratios[name][-1],
                              "acceptance rate": spec["num_accepted_tokens"] / spec["num_draft_tokens"]
                              if spec["num_draft_tokens"] else 0.0})
            print(f"round {r + 1} {name:<8}: off {runs[False][0]:.2f} s {runs[False][1]:.1f} tok/s, on "
                  f"{runs[True][0]:.2f} s {runs[True][1]:.1f} tok/s: on/off {ratios[name][-1]:.2f}x; "
                  f"{describe_spec(runs[True][2])}", flush=True)
    differ = False
    for name in workloads:
        same = sum(a == b for a, b in zip(outputs[name][False], outputs[name][True]))
        differ |= same != len(outputs[name][False])
        print(f"{name}: on/off tok/s per round {', '.join(f'{x:.2f}' for x in ratios[name])}, median "
              f"{statistics.median(ratios[name]):.2f}x; outputs identical: "
              f"{'yes' if same == len(outputs[name][False]) else 'no'} ({same} of {len(outputs[name][False])})")
        summary[f"{name}: on / off tok/s, median"] = statistics.median(ratios[name])
        summary[f"{name}: identical outputs"] = f"{same} of {len(outputs[name][False])}"
    results.save(args, "spec_decode", __file__, per_round, summary, argv=argv)
    for llm in engines.values():
        llm.shutdown()
    return 1 if differ and args.dtype == "float32" else 0  # bf16: reported above, not an error (see the docstring)


if __name__ == "__main__":
    sys.exit(main())
