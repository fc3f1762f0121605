"""Grading a class (issue 47): the CSV says graded, missing, error or timeout; an endless submission costs one
time bound per lab; every check has one name; the feedback file says how to read it."""
from __future__ import annotations

import csv
import subprocess
import sys


import pytest

pytestmark = pytest.mark.timeout(900)
from test_labs_isolation import HONEST  # noqa: E402 (lab 7's honest submission, one copy)

CLASS = {"alice": HONEST,
         "bob_stub": "\ndef hash_block_tokens(parent_block_hash, curr_block_token_ids):\n"
                     "    raise NotImplementedError\n",
         "carl_missing": None,
         "dora_broken": "def hash_block_tokens(parent, tokens)\n    return b''\n",  # a syntax error
         "erin_endless": "while True:\n    pass\n" + HONEST}


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    for name, source in CLASS.items():
        (root / name / "exercises").mkdir(parents=True)
        if source is not None:
            (root / name / "exercises" / "lab07_block_hash.py").write_text(source)
    out = tmp_path_factory.mktemp("out")
    result = subprocess.run([sys.executable, "-m", "minivllm.labs", "grade", str(root), "--csv", str(out / "g.csv"),
                             "--labs", "7", "--timeout", "30"], capture_output=True, text=True, timeout=800)
    assert result.returncode == 0, result.stderr[-3000:]
    return {r["student"]: r for r in csv.DictReader(open(out / "g.csv"))}, out / "g_feedback", result.stdout


def test_the_csv_says_why_a_score_is_0(graded):
    rows, _, stdout = graded
    assert {name: (r["status"], r["score"]) for name, r in rows.items()} == {
        "alice": ("graded", "1.00"), "bob_stub": ("graded", "0.00"), "carl_missing": ("missing", "0.00"),
        "dora_broken": ("error", "0.00"), "erin_endless": ("timeout", "0.00")}, stdout[-3000:]


def test_an_endless_import_costs_one_time_bound(graded):
    _, feedback, _ = graded
    text = (feedback / "erin_endless.txt").read_text()
    assert text.count("did not finish within 30 s") == 1, text


def test_the_feedback_file_says_how_to_read_it(graded):
    _, feedback, _ = graded
    text = (feedback / "carl_missing.txt").read_text()
    assert "lab  7  0/6 checks  score 0.00  (missing)" in text and "How to read this" in text, text
    assert "no lab07_block_hash.py" in text


def test_every_failure_line_names_the_check_of_the_summary():
    """A failure raised under another name (a scenario's own) is printed under the check's name first."""
    from minivllm.labs.faults import FAULTS  # noqa: F401 - the instructor's tree
    from minivllm.labs.grader import check_lab
    from minivllm.labs.registry import LABS
    lines = []
    check_lab(7, fault="hash-unchained", out=lines.append)
    names = [name for name, _, _ in LABS[7].checks]
    for line in lines:
        if line.startswith("FAIL  check "):
            assert any(line.startswith(f"FAIL  check {n!r} failed") for n in names), line
