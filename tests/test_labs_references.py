"""Every lab's reference solution passes when a student hands it in as a file: through `check --submission` and
through `grade` (issue 47: lab 13's reference failed every time as a file, and only the in-package run was tested).
"""
from __future__ import annotations

import csv
import shutil
import subprocess
import sys

import pytest

from minivllm.labs.grader import EXERCISES, check_lab
from minivllm.labs.registry import LABS

pytestmark = pytest.mark.timeout(1800)


@pytest.mark.parametrize("lab_id", sorted(LABS))
def test_the_reference_passes_as_a_submission_file(lab_id, tmp_path):
    path = tmp_path / f"{LABS[lab_id].module}.py"
    shutil.copy(EXERCISES / path.name, path)  # a student's copy, outside the package
    lines = []
    passed, total = check_lab(lab_id, path, out=lines.append)
    assert passed == total, "\n".join(lines)


def test_grade_gives_the_reference_full_marks_in_every_lab(tmp_path):
    shutil.copytree(EXERCISES, tmp_path / "class" / "ref" / "exercises", ignore=shutil.ignore_patterns("__*"))
    result = subprocess.run([sys.executable, "-m", "minivllm.labs", "grade", str(tmp_path / "class"), "--csv",
                             str(tmp_path / "g.csv")], capture_output=True, text=True, timeout=1700)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "g.csv")))
    assert [(int(r["lab"]), r["score"]) for r in rows] == [(n, "1.00") for n in sorted(LABS)], result.stdout[-4000:]
