"""The check cell of every notebook lab: compare a prediction with what the engine measured.

Each notebook ends with a Predict lab: a knob, a question, `MY_ANSWER` (between `### BEGIN SOLUTION` and
`### END SOLUTION` in the reference notebook; `MY_ANSWER = None` in the student copy), then a cell that runs the
real engine and calls `check_prediction`. The check never gives the answer away: a wrong prediction gets a
hint that says where to look (a trace line, a formula), and the measured value is printed only once the
prediction matches it. There is no grading, no scores and no hidden tests: the engine run is the reference.
"""

from __future__ import annotations

from minivllm.labs.errors import LabCheckFailed

NOT_SET = "set MY_ANSWER to your prediction first"


def check_prediction(name: str, prediction, measured, hint: str) -> None:
    """Raise LabCheckFailed unless `prediction == measured`; on a match print the measured value.

    `measured` must come from the engine run in the notebook, never be typed in. For example, lab 01:
        check_prediction("steps for MAX_TOKENS tokens", MY_ANSWER, steps, hint="which step samples token 1?")
    MY_ANSWER = None -> "set MY_ANSWER to your prediction first"; MY_ANSWER = "6" when 6 was measured ->
    "MY_ANSWER should be an int"; MY_ANSWER = 5 -> "MY_ANSWER = 5 is not what the engine measured" and the
    hint (the 6 stays hidden); MY_ANSWER = 6 -> prints "right: steps for MAX_TOKENS tokens = 6".
    """
    if prediction is None:
        raise LabCheckFailed(check=name, where="MY_ANSWER", expected="a prediction", got="None", hint=NOT_SET)
    if type(prediction) is not type(measured):
        kind = type(measured).__name__
        raise LabCheckFailed(check=name, where="MY_ANSWER", expected=f"{_article(kind)} {kind}",
                             got=f"{prediction!r} ({type(prediction).__name__})",
                             hint=f"MY_ANSWER should be {_article(kind)} {kind}; then: {hint}")
    if prediction != measured:
        raise LabCheckFailed(check=name, where="MY_ANSWER", expected="the measured value (shown once you match it)",
                             got=repr(prediction), hint=hint)
    print(f"right: {name} = {measured!r}")


def _article(noun: str) -> str:
    return "an" if noun[:1] in "aeiou" else "a"
