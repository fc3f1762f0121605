"""A submission cannot fake a grade or touch a classmate's: every check runs in its own bounded process, and the
verdict is computed in the grader's process from what that process sends back (issue 23, items 10-12).

Lab 7 (the block hash) is the attacked lab: three short checks. One `grade` run over a class of attackers and
one honest student serves the attacks that would end or hang an in-process grader; the rest call check_lab.
"""
from __future__ import annotations

import csv
import subprocess
import sys
import textwrap

import pytest

from minivllm.labs.grader import EXERCISES, check_lab
from minivllm.labs.registry import LABS
from minivllm.labs.student import write_student_copies

pytestmark = pytest.mark.timeout(600)

HONEST = textwrap.dedent('''
    import hashlib
    import struct

    from minivllm.core.kv_cache_utils import NONE_HASH


    def hash_block_tokens(parent_block_hash, curr_block_token_ids):
        parent = NONE_HASH if parent_block_hash is None else parent_block_hash
        packed = struct.pack(f"<{len(curr_block_token_ids)}q", *curr_block_token_ids)
        return hashlib.sha256(parent + packed).digest()
''')
STUB = '\ndef hash_block_tokens(parent_block_hash, curr_block_token_ids):\n    raise NotImplementedError("write it")\n'
N7 = len(LABS[7].checks)
PASS_LINE = f"lab 7: {N7}/{N7} checks passed  score 1.00"
NUKE_CHECKS = "for lab in LABS.values():\n    lab.checks = [(c[0],) + tuple((lambda *a, **k: None) for _ in c[1:]) " \
              "for c in lab.checks]\n"

CLASS = {  # sorted by name: the saboteur is graded first
    "aaron_saboteur": "import struct\n_pack = struct.pack\nstruct.pack = lambda fmt, *v: b''\n" + STUB,
    "alice_honest": HONEST,
    "carl_exit_at_import": f"print({PASS_LINE!r})\nimport os\nos._exit(0)\n" + HONEST,
    "dora_exit_in_function": "import os\n" + STUB.replace('raise NotImplementedError("write it")',
                                                          f'print({PASS_LINE!r}); os._exit(0)'),
    "erin_memory_bomb": "_HOARD = bytearray(6 << 30)\n" + HONEST,
    "fred_hang": "while True:\n    pass\n" + HONEST,
    "gina_reference": "from minivllm.labs.exercises.lab07_block_hash import hash_block_tokens\n",
    "hank_engine": "from minivllm.core.kv_cache_utils import hash_block_tokens\n",
}


def _write(folder, source):
    folder.mkdir(parents=True)
    (folder / "lab07_block_hash.py").write_text(source)
    return folder


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    root = tmp_path_factory.mktemp("class")
    for name, source in CLASS.items():
        _write(root / name / "exercises", source)
    result = subprocess.run([sys.executable, "-m", "minivllm.labs", "grade", str(root), "--csv", str(root / "g.csv"),
                             "--labs", "7", "--timeout", "15"], capture_output=True, text=True, timeout=500)
    assert result.returncode == 0 and (root / "g.csv").exists(), (result.stdout[-3000:], result.stderr[-3000:])
    scores = {r["student"]: r["score"] for r in csv.DictReader(open(root / "g.csv"))}
    feedback = {part.split(",")[0].strip(): part for part in result.stdout.split("== ")[1:]}
    return scores, feedback


def test_a_saboteur_cannot_change_a_classmates_score(graded_class):
    scores, feedback = graded_class
    assert scores["alice_honest"] == "1.00", feedback["alice_honest"]
    assert scores["aaron_saboteur"] == "0.00", feedback["aaron_saboteur"]


@pytest.mark.parametrize("student", ["carl_exit_at_import", "dora_exit_in_function"])
def test_printing_the_pass_line_and_exiting_is_a_failed_check(graded_class, student):
    scores, feedback = graded_class
    assert scores[student] == "0.00", feedback[student]
    assert "exited with code 0 before sending a result" in feedback[student] and "os._exit" in feedback[student]


def test_a_memory_bomb_is_stopped_by_the_memory_bound(graded_class):
    scores, feedback = graded_class
    assert scores["erin_memory_bomb"] == "0.00"
    assert "MemoryError" in feedback["erin_memory_bomb"] and "--memory-mb" in feedback["erin_memory_bomb"]


def test_an_endless_loop_at_import_is_stopped_by_the_time_bound(graded_class):
    scores, feedback = graded_class
    assert scores["fred_hang"] == "0.00" and "did not finish within 15 s" in feedback["fred_hang"]


@pytest.mark.parametrize("student, names", [("gina_reference", "minivllm.labs"),
                                            ("hank_engine", "hash_block_tokens is the engine's own function")])
def test_importing_the_reference_solution_is_refused(graded_class, student, names):
    scores, feedback = graded_class
    assert scores[student] == "0.00" and "refused:" in feedback[student] and names in feedback[student]


def test_check_exits_nonzero_after_a_printed_pass_and_exit(tmp_path):
    """`check` itself: the fake pass line is the student's output, never the score; the exit code is 1."""
    source = "import os\n" + STUB.replace('raise NotImplementedError("write it")', f'print({PASS_LINE!r}); os._exit(0)')
    folder = _write(tmp_path / "s", source)
    result = subprocess.run([sys.executable, "-m", "minivllm.labs", "check", "7", "--submission", str(folder)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 1 and result.stdout.splitlines()[-1] == f"lab 7: 0/{N7} checks passed  score 0.00", \
        result.stdout[-2000:]


def _grade(source, tmp_path, **bounds):
    lines = []
    passed, total = check_lab(7, _write(tmp_path / "s", source), out=lines.append, **bounds)
    return passed, total, "\n".join(lines)


@pytest.mark.parametrize("how", [
    "from minivllm.labs.registry import LABS\n",  # refused by reading the file
    "LABS = __builtins__['__import__']('minivllm.labs.registry', fromlist=['LABS']).LABS\n",  # refused on import
])
def test_patching_the_checks_at_import_is_refused(tmp_path, how):
    passed, _, lines = _grade(how + NUKE_CHECKS + STUB, tmp_path)
    assert passed == 0 and "refused:" in lines and "minivllm.labs" in lines, lines


def test_checks_rewritten_inside_the_grading_process_still_fail(tmp_path):
    """Past both import guards (through sys.modules): the process's own checks change, the verdicts do not."""
    how = ("sys = __builtins__['__import__']('sys')\nLABS = getattr(sys, 'mod' + 'ules')['minivllm.labs.registry'].LABS\n")
    passed, _, lines = _grade(how + NUKE_CHECKS + STUB, tmp_path)
    assert passed == 0, lines


def test_calling_the_engines_function_grabbed_at_import_is_refused(tmp_path):
    source = ("import minivllm.core.kv_cache_utils as k\n_theirs = getattr(k, 'hash_' + 'block_tokens')\n\n"
              "def hash_block_tokens(parent, tokens):\n    return _theirs(parent, tokens)\n")
    passed, _, lines = _grade(source, tmp_path)
    assert passed == 0 and "refused: your code called the engine's own hash_block_tokens" in lines, lines


@pytest.mark.timeout(600)  # bounds a hang: the grader's zygote builds an engine first, slow on a busy machine
def test_an_endless_loop_in_the_function_ends_the_lab_at_one_timeout(tmp_path):
    """Issue 47: one endless submission used to cost the time bound once per check; now once per lab."""
    source = HONEST.replace("    parent = NONE_HASH", "    while True:\n        pass\n    parent = NONE_HASH")
    report = {}
    passed, total, lines = _grade(source, tmp_path, timeout=3, report=report)
    assert passed == 0 and lines.count("did not finish within 3 s") == 1, lines
    assert lines.count("not run: an earlier check did not finish in time") == total - 1, lines
    assert report["status"] == "timeout"


def test_a_memory_bomb_in_the_function_is_a_failed_check(tmp_path):
    source = HONEST.replace("    parent = NONE_HASH", "    _hoard = [bytearray(1 << 26) for _ in range(10_000)]\n"
                                                      "    parent = NONE_HASH")
    passed, _, lines = _grade(source, tmp_path, memory_mb=512)
    assert passed == 0 and "MemoryError" in lines and "memory bound of 512 MB" in lines, lines


@pytest.mark.parametrize("lab_id", sorted(LABS))
def test_an_untouched_stub_scores_0(lab_id, tmp_path):
    """Every check calls the student's function: a stub passes none of them (lab 2's chunked check used to)."""
    write_student_copies(tmp_path, EXERCISES, None)
    lines = []
    passed, total = check_lab(lab_id, tmp_path / "exercises", out=lines.append)
    assert passed == 0, "\n".join(lines)
    assert lines[-1] == f"lab {lab_id}: 0/{total} checks passed  score 0.00"


@pytest.mark.timeout(300)
def test_the_graders_own_loop_is_bounded_in_steps(tmp_path):
    """Lab 2's victim-state check steps the engine after the preemption; a submission that stalls the scheduler
    (the victim is never readmitted) fails it at the step bound, not by hanging or by the time bound."""
    base = (EXERCISES / "lab02_preemption.py").read_text()
    body = base.split("### BEGIN SOLUTION\n")[1].split("    ### END SOLUTION")[0]
    source = ("from minivllm.request import RequestStatus\n\n\ndef _preempt_request(self, request):\n" + body +
              "    self.scheduler_config.max_num_batched_tokens = 0\n")
    folder = tmp_path / "s"
    folder.mkdir()
    (folder / "lab02_preemption.py").write_text(source)
    lines = []
    passed, total = check_lab(2, folder, out=lines.append, first_failure=True)
    text = "\n".join(lines)
    assert passed < total and "(at check 'terminates')" in text and "within 400 steps" in text, text
    assert "did not finish within" not in text, text
