"""Lab 13 (the output processor): stop strings on incrementally detokenized text. Write _check_stop_strings.

In the caller's process every step's new tokens are decoded into new characters (`delta`), appended to the
request's output text; then the stop strings are looked for. A stop string may end in the new characters and
start in the old ones: the tokenizer cuts text where it likes. Found, the request stops ("stop", with the
string as its stop_reason), its text ends before the string (or after it, when the string is kept), and
EngineCore is told to free it. Time: about 30 minutes.
"""


def _check_stop_strings(state, delta):
    """Return the stop string the new text completed, or None; when one is found, cut the output text.

    Inputs: state.params.stop (the stop strings, a list, maybe empty), state.params.include_stop_str_in_output
    (keep the stop string in the text), state.detokenizer.output_text (the whole output text, the new
    characters already appended), delta (the new characters: the last len(delta) of output_text).
    Rules (as vLLM's check_stop_strings):
      - no new characters or no stop strings: None, the text unchanged;
      - a match counts only if it ends inside the new characters: for a stop string s look from position
        len(output_text) - len(delta) - len(s) + 1 (not below 0) on; an older match was checked before (or
        came while min_tokens held the check off) and does not count;
      - the stop strings are tried in their list order; the first one found wins, at its first position from
        there;
      - the text is cut at that position, or after the stop string when include_stop_str_in_output.
    Invariants: the text only ever gets shorter; None leaves it as it was; the returned value is one of
    params.stop.
    Example: stop ["world"], output_text "Hello world!" of which delta "rld!" is new -> "world" is found at
    6 (it started in the old text): "world" is returned and the text becomes "Hello " ("Hello world" when
    the stop string is kept).
    """
    ### BEGIN SOLUTION
    if not delta or not state.params.stop:
        return None
    detok = state.detokenizer
    for stop in state.params.stop:
        start = max(0, len(detok.output_text) - len(delta) - len(stop) + 1)
        index = detok.output_text.find(stop, start)
        if index != -1:
            end = index + len(stop) if state.params.include_stop_str_in_output else index
            detok.output_text = detok.output_text[:end]
            return stop
    return None
    ### END SOLUTION
