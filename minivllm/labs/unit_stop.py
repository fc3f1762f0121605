"""Lab 13 (stop strings): OutputProcessor._check_stop_strings on texts built by hand (unit), then in the engine.

A unit case is the state the output processor passes: the request's SamplingParams (stop,
include_stop_str_in_output) and its detokenizer's output_text with the step's new characters already appended.
The submission's return value and the text it leaves are compared with the engine's own function's. The engine
check generates with stop strings taken from the reference run's own text, around a token boundary, so that a
stop string always straddles two steps' new characters.
"""
from __future__ import annotations

from types import SimpleNamespace

from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.sampling_params import SamplingParams

_WINDOW = ("a stop string may start in the old text: look from len(output_text) - len(delta) - len(stop) + 1 on, "
           "not only in the new characters")
_OLD = "a match that ends before the new characters was there before (or came under min_tokens): it does not count"
_KEEP = "include_stop_str_in_output keeps the stop string: cut after it, not before it"
_ORDER = "the stop strings are tried in their list order: the first one found wins, not the earliest in the text"
_CUT = "a stop string found ends the text: cut output_text at it (after it when it is kept)"
_FIRST = "cut at the stop string's first position in the window, not its last"
_CLAMP = ("early in the output the window's start is negative: clamp it at 0 (str.find counts a negative start from "
          "the end of the text)")
# (label, output text, number of new characters, stop strings, include_stop_str_in_output, hint)
CASES = [("the docstring's example", "Hello world!", 4, ["world"], False, _WINDOW),
         ("the docstring's example, kept", "Hello world!", 4, ["world"], True, _WINDOW),
         ("a stop string inside the new characters", "The end. Or not", 9, ["."], False, _CUT),
         ("kept, inside the new characters", "The end. Or not", 9, ["."], True, _KEEP),
         ("an older match before the window", "a. b. c", 2, ["."], False, _OLD),
         ("two stop strings, the later one in the text listed first", "x; y. z", 6, [".", ";"], False, _ORDER),
         ("twice in the new characters", "ab--cd--ef", 8, ["--"], False, _FIRST),
         ("no new characters", "stop here", 0, ["stop"], False, "no new characters: nothing to look for, None"),
         ("a stop string longer than the new text", "abcdef", 1, ["bcdef"], False, _WINDOW),
         ("the whole text new, a stop string at its start", "stop here", 9, ["stop"], False, _CLAMP),
         ("at the window's first position, more new characters after", "xxSTOP!?", 3, ["STOP"], True, _WINDOW),
         ("no match", "nothing here", 5, ["zz", "yy"], False, "no stop string found: None and the text unchanged")]


def _state(text, stop, keep):
    params = SamplingParams(max_tokens=4, stop=list(stop), include_stop_str_in_output=keep)
    return SimpleNamespace(params=params, detokenizer=SimpleNamespace(output_text=text))


@unit
def lab13_unit_observe(sub, llm, obs):
    obs["cases"] = []
    for _, text, new, stop, keep, _ in CASES:
        state = _state(text, stop, keep)
        got = sub["_check_stop_strings"](state, text[len(text) - new:])
        obs["cases"].append([got if got is None or isinstance(got, str) else repr(got)[:40],
                             str(state.detokenizer.output_text)[:80]])


def lab13_unit_judge(obs, ref):
    check = "stop strings: the window, the order, the cut"
    for case, exp, got in zip(CASES, ref["cases"], obs["cases"]):
        label, text, new, stop, keep, hint = case
        where = f"{label}: output_text {text!r}, {new} new, stop {stop}, include_stop_str_in_output={keep}"
        if got[0] != exp[0]:
            raise LabCheckFailed(check, f"{where}: the stop string returned", exp[0], got[0], hint)
        if got[1] != exp[1]:
            text_hint = hint if hint in (_FIRST, _OLD) else _KEEP if keep else _CUT
            raise LabCheckFailed(check, f"{where}: output_text after the call", repr(exp[1]), repr(got[1]), text_hint)


def _boundaries(llm, prompt: str) -> tuple[str, list[int]]:
    """The greedy text of `prompt` (16 tokens) and where each token's text ends in it."""
    out = llm.generate([prompt], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True), use_tqdm=False)
    ids, tok = out[0].outputs[0].token_ids, llm.get_tokenizer()
    return out[0].outputs[0].text, [len(tok.decode(ids[:i + 1])) for i in range(len(ids))]


def lab13_engine_observe(sub, llm, obs):
    """Two prompts, each stopped by a string around a token boundary, one keeping it; plus a stop list whose
    second string comes first in the text."""
    from minivllm.labs.engine_checks import PROMPTS
    obs["runs"] = []
    for i, prompt in enumerate(PROMPTS[:2]):
        text, ends = _boundaries(llm, prompt)
        cut = next((e for e in ends[4:] if 2 <= e <= len(text) - 2), None)
        stops = [text[cut - 2:cut + 2]] if cut else ["\x00"]
        if i == 1 and cut:
            stops = [text[cut - 1:cut + 3], text[ends[1] - 2:ends[1] + 1]]  # the second comes first in the text
        params = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop=stops,
                                include_stop_str_in_output=i == 0)
        out = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        obs["runs"].append({"stop": stops, "text": out.text, "finish_reason": out.finish_reason,
                            "stop_reason": out.stop_reason, "tokens": len(out.token_ids)})


def lab13_engine_judge(obs, ref):
    check = "in the engine: stopped text = reference"
    for i, (exp, got) in enumerate(zip(ref["runs"], obs["runs"])):
        if not exp["finish_reason"] == "stop":
            raise RuntimeError("the grader's stop strings never matched: the grader itself needs fixing")
        for what in ("finish_reason", "stop_reason", "text", "tokens"):
            if got[what] != exp[what]:
                hint = _ORDER if len(exp["stop"]) > 1 else _WINDOW if what != "text" else _CUT
                raise LabCheckFailed(check, f"request {i}, stop {exp['stop']}, kept={i == 0}: {what}",
                                     repr(exp[what]), repr(got[what]), hint)
