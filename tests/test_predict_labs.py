"""The Predict labs: check_prediction teaches without giving the answer away, and every notebook lab is marked."""

import json
import re
from pathlib import Path

import pytest

from minivllm.labs.predict import NOT_SET, LabCheckFailed, check_prediction

NOTEBOOKS = sorted((Path(__file__).parent.parent / "notebooks").glob("0[1-79]_*.ipynb"))
BARE_ASSERT = re.compile(r"^\s*assert\b.*==\s*MY_ANSWER\b", re.MULTILINE)
KNOB = re.compile(r"^[A-Z_]+ = .+# try \S", re.MULTILINE)


def test_a_missing_prediction_asks_for_one():
    with pytest.raises(LabCheckFailed, match=NOT_SET):
        check_prediction("steps for 6 tokens", None, 6, hint="which step samples token 1?")


def test_a_wrong_prediction_gets_the_hint_not_the_measured_value():
    with pytest.raises(LabCheckFailed) as failed:
        check_prediction("steps", 5, 6, hint="which step samples the first token?")
    message = str(failed.value)
    assert "which step samples the first token?" in message and "5" in message
    assert "6" not in message
    assert isinstance(failed.value, AssertionError)  # a lab check fails like an assert


def test_a_prediction_of_the_wrong_type_says_which_type():
    with pytest.raises(LabCheckFailed, match="MY_ANSWER should be a list"):
        check_prediction("blocks owned", (1, 2), [1, 2], hint="count the cached tokens")


def test_a_right_prediction_prints_the_measured_value(capsys):
    check_prediction("steps for 6 tokens", 6, 6, hint="unused")
    assert capsys.readouterr().out == "right: steps for 6 tokens = 6\n"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_lab_has_a_knob_a_solution_block_and_a_teaching_check(path):
    cells = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    answers = [i for i, source in enumerate(cells) if "### BEGIN SOLUTION" in source]
    assert answers, "every notebook ends in a lab (notebook 01 has a second, on async scheduling)"
    for i in answers:
        source = cells[i]
        block = source.split("### BEGIN SOLUTION\n")[1].split("### END SOLUTION")[0]
        assert re.fullmatch(r"MY_(\w+_)?ANSWER = [^#\n]+\n", block), "the solution block holds the answer only"
        assert KNOB.search(source), "a knob with its range: NAME = value  # try ..."
        assert "check_prediction(" in cells[i + 1]
    assert not any(BARE_ASSERT.search(s) for s in cells)
