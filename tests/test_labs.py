"""The labs' grader bites: every reference passes, every named fault fails its lab, a student stub fails.

One process shares the graders' in-process engines (SmolLM2, 12 blocks of 8 tokens), so each lab's runs are a
few short greedy generations; faults and stubs stop at their first failed check.
"""
from __future__ import annotations

import csv
import json
import shutil
import subprocess
import sys

import pytest

from minivllm.labs.faults import FAULTS
from minivllm.labs.grader import EXERCISES, check_lab
from minivllm.labs.registry import LABS
from minivllm.labs.student import write_student_copies

pytestmark = pytest.mark.timeout(600)


def _grade(lab_id, submission=None, fault=None, first_failure=False):
    lines = []
    passed, total = check_lab(lab_id, submission, fault, out=lines.append, first_failure=first_failure)
    return passed, total, lines


@pytest.fixture(scope="module")
def student_dir(tmp_path_factory):
    dest = tmp_path_factory.mktemp("student")
    write_student_copies(dest, EXERCISES, None)
    return dest


@pytest.mark.parametrize("lab_id", sorted(LABS))
def test_reference_passes(lab_id):
    passed, total, lines = _grade(lab_id)
    assert passed == total, "\n".join(lines)
    assert lines[-1] == f"lab {lab_id}: {total}/{total} checks passed  score 1.00"


# every fault's first failed check, and where it points: the grader catches each for the right reason
_STATE, _BLOCKS = "preemption: victim state and counters", "preemption: shared blocks and free order"
_STOP, _FREE, _FREE_BLOCKS = ("stop check: every rule and boundary", "free: request forgotten, runner told",
                              "free: shared blocks, free order, later hits")
_DIGEST, _INDICES, _CONTEXT, _KV, _MASKS = ("digest = the specified sha256", "indices = formula",
                                            "context of the named layer", "write and read = formula", "masks = formula")
_GREEDY9, _RANDOM9 = "greedy: kept prefix, then the target token", "random: the target distribution"
_MATCH10, _RUNNING11, _ADMIT11 = ("drafts: the longest n-gram, first match", "running: drafts, budget, max_model_len",
                                  "admission: the hit, threshold, whole or nothing")
_LOOKUP12, _STOP13, _FORWARD14 = ("lookup: the longest cached prefix, capped", "stop strings: the window, the order, "
                                 "the cut", "forward: partial sums, all-reduced")
CAUGHT_BY = {
    "generate-one-step": ("nothing left running", "after generate_loop"),
    "generate-finish-order": ("outputs in prompt order", "RequestOutput.prompt"),
    "generate-max-tokens-steps": ("nothing left running", "after generate_loop"),
    "generate-first-output": ("greedy tokens = LLM.generate", "number of output tokens"),
    "preempt-append": (_STATE, "WAITING, head first"),
    "preempt-keep-progress": (_STATE, "num_computed_tokens"),
    "preempt-no-free": (_BLOCKS, "ref_cnt of block 1"),
    "preempt-free-forward": (_BLOCKS, "free queue"),
    "preempt-no-request-count": (_STATE, "request.num_preemptions"),
    "preempt-evicts-cache": (_BLOCKS, "prefix-cache hit"),
    "budget-clamp-removed": ("token budget", "total_num_scheduled_tokens"),
    "victim-fifo": ("victim = the latest admitted", "preemption 0"),
    "logits-every-row": (_INDICES, "logits_indices, number of rows"),
    "positions-restart": (_INDICES, "positions[0]"),
    "pack-block-size-4": (_INDICES, "block_size 8"),
    "sampling-strict": (_INDICES, "sampling, number of rows"),
    "logits-first-row": (_INDICES, "logits_indices[1]"),
    "wrong-layer-cache": (_CONTEXT, "kv_cache"),
    "context-cached": (_CONTEXT, "step 2"),
    "context-slot-dict": (_CONTEXT, "slot_mapping"),
    "context-shared-slots": (_CONTEXT, "slot_mapping"),
    "slot-off-by-one": (_KV, "K cache, flat slot"),
    "kv-padding-written": (_KV, "flat slot 0"),
    "kv-swapped": (_KV, "K cache, flat slot"),
    "block-table-shuffled": (_KV, "gather_blocks"),
    "gather-block-size-4": (_KV, "block_size 8: gather_blocks"),
    "stop-off-by-one": (_STOP, "max_tokens reached"),
    "stop-ignores-eos": (_STOP, "EOS as the 3rd output token"),
    "stop-eos-before-length": (_STOP, "EOS as the last allowed token"),
    "stop-model-len-off-by-one": (_STOP, "max_model_len reached"),
    "free-not-freed": (_FREE_BLOCKS, "ref_cnt of block 1"),
    "free-keeps-registered": (_FREE, "still in scheduler.requests"),
    "free-no-finished-ids": (_FREE, "finished_req_ids"),
    "free-forward-order": (_FREE_BLOCKS, "free queue"),
    "hash-unchained": (_DIGEST, "block 1"),
    "hash-xor-chain": (_DIGEST, "block 1"),
    "hash-tokens-first": (_DIGEST, "block 0"),
    "hash-int32": (_DIGEST, "block 0"),
    "hash-empty-seed": (_DIGEST, "block 0"),
    "top-k-plus-one": (_MASKS, "top_k=[1, 5, 0, 50], top_p=None, row 0"),
    "top-p-ignored": (_MASKS, "top_k=None"),
    "top-p-drops-crossing": (_MASKS, "top_k=None"),
    "top-k-zero-keeps-one": (_MASKS, "row 2"),
    "top-p-before-top-k": (_MASKS, "top_k=[3, 10, 0, 20]"),
    "reject-no-break": (_GREEDY9, "the docstring's example (vocab 10): request 0"),
    "reject-always-bonus": (_GREEDY9, "the docstring's example (vocab 10): request 0"),
    "reject-row-off-by-one": (_GREEDY9, "the docstring's example (vocab 10): request 1"),
    "reject-previous-row": (_GREEDY9, "the docstring's example (vocab 10): request 0"),
    "reject-resample-from-p": (_RANDOM9, "vocab 5, temperature 1, 3000 requests with drafts [1, 4]: counts of output "
                               "token 0"),
    "reject-global-rng": ("random: every request on its own generator", "in a batch of 40 then in the reverse order"),
    "reject-draw-for-greedy": ("random: the exact random stream of each request",
                               "(unseeded: the engine's generator"),
    "reject-argmax-for-random": (_RANDOM9, "vocab 5, temperature 1, 3000 requests with drafts [1, 4]: counts of "
                                 "output token 0"),
    "ngram-last-occurrence": (_MATCH10, "two earlier occurrences"),
    "ngram-shortest-first": (_MATCH10, "a longer n-gram beats a shorter one"),
    "ngram-slice-off-by-one": (_MATCH10, "the docstring's example"),
    "ngram-ignores-max-model-len": ("drafts: at most k, never past max_model_len", "max_model_len two tokens away"),
    "ngram-self-match": (_MATCH10, "the docstring's example"),
    "new-tokens-no-budget-clamp": (_RUNNING11, "a decode with 3 drafts, budget 2:"),
    "new-tokens-threshold-unchunked": (_ADMIT11, "no chunked prefill, a threshold of 8:"),
    "new-tokens-ignore-drafts": (_RUNNING11, "a decode with 3 drafts:"),
    "new-tokens-admit-overflow": (_ADMIT11, "no chunked prefill: the prompt does not fit:"),
    "new-tokens-strict-fit": ("no chunked prefill, an exact fit: schedule = reference", "tokens scheduled"),
    "new-tokens-model-len-off-by-one": (_RUNNING11, "3 drafts, two positions from max_model_len:"),
    "prefix-skips-holes": (_LOOKUP12, "block 1 evicted"),
    "prefix-no-cap": (_LOOKUP12, "a multiple of block_size"),
    "prefix-caps-tokens": (_LOOKUP12, "a multiple of block_size"),
    "prefix-reads-for-logprobs": (_LOOKUP12, "asks for prompt logprobs"),
    "prefix-touches": ("lookup: nothing taken, the pool unchanged", "ref_cnt of every block"),
    "prefix-counts-blocks": (_LOOKUP12, "num_computed_tokens"),
    "prefix-not-after-preemption": ("preempted: tokens scheduled = reference", "tokens scheduled"),
    "stop-new-chars-only": (_STOP13, "the docstring's example:"),
    "stop-whole-text": (_STOP13, "an older match"),
    "stop-never-kept": (_STOP13, "the docstring's example, kept"),
    "stop-earliest-in-text": (_STOP13, "two stop strings"),
    "stop-not-cut": (_STOP13, "output_text after the call"),
    "stop-last-occurrence": (_STOP13, "twice in the new characters"),
    "stop-window-unclamped": (_STOP13, "the whole text new, a stop string at its start"),
    "row-bias-every-rank": ("local_bias: the bias once", "rank 1"),
    "row-shard-wrong-dim": ("weight_loader: each rank its columns", "a square weight, tp 2"),
    "row-shard-reversed": ("weight_loader: each rank its columns", "rank 0"),
    "row-reduce-per-token": ("forward: the collectives each rank performs", "its collectives in order"),
    "row-no-all-reduce": (_FORWARD14, "forward output"),
    "row-reduce-before-matmul": (_FORWARD14, "forward output"),
}
# the hint a fault's failure must carry: it names the mistake, not only the symptom
HINTED = {"pack-block-size-4": "not a constant 4", "hash-tokens-first": "parent's hash comes first",
          "hash-int32": "int64", "hash-empty-seed": "NONE_HASH", "hash-xor-chain": "XOR",
          "hash-unchained": "chain the blocks", "generate-finish-order": "in the order they finished",
          "stop-eos-before-length": "length check comes first", "top-k-zero-keeps-one": "k <= 0",
          "preempt-no-free": "never dropped", "free-forward-order": "tail first",
          "reject-no-break": "no draft after it", "reject-always-bonus": "only when every draft was kept",
          "reject-row-off-by-one": "none for a bonus token", "reject-resample-from-p": "residual",
          "reject-argmax-for-random": "greedy rows only", "reject-global-rng": "md.generators[r]",
          "reject-draw-for-greedy": "a greedy row draws no random number",
          "ngram-last-occurrence": "earliest occurrence", "ngram-shortest-first": "longest n first",
          "ngram-slice-off-by-one": "start + n", "ngram-self-match": "ends before the last token",
          "ngram-ignores-max-model-len": "max_model_len - len", "new-tokens-ignore-drafts": "num_tokens_with_spec",
          "new-tokens-threshold-unchunked": "only when chunked prefill is on",
          "new-tokens-admit-overflow": "whole or not at all", "new-tokens-model-len-off-by-one": "max_model_len - 1",
          "new-tokens-no-budget-clamp": "token_budget",
          "new-tokens-strict-fit": "equals the budget left fits", "prefix-skips-holes": "first block that misses",
          "prefix-no-cap": "num_tokens - 1", "prefix-reads-for-logprobs": "skip_reading_prefix_cache",
          "prefix-touches": "look up only", "prefix-counts-blocks": "whole blocks",
          "prefix-not-after-preemption": "looked up again when it is readmitted",
          "stop-new-chars-only": "start in the old text", "stop-whole-text": "does not count",
          "stop-never-kept": "cut after it", "stop-earliest-in-text": "list order", "stop-not-cut": "cut output_text",
          "stop-last-occurrence": "first position", "row-bias-every-rank": "only rank 0",
          "row-shard-wrong-dim": "input dimension (dim 1)", "row-shard-reversed": "tp_rank * n",
          "row-no-all-reduce": "tensor_model_parallel_all_reduce", "row-reduce-before-matmul": "(not of the input)"}


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_each_fault_fails_its_lab(fault):
    lab_id = FAULTS[fault][0]
    passed, total, lines = _grade(lab_id, fault=fault, first_failure=True)
    assert passed < total, "\n".join(lines)
    failure = next(line for line in lines if line.startswith("FAIL"))
    assert "check '" in failure and "where:" in failure and "hint:" in failure, failure  # never a bare assert
    check, where = CAUGHT_BY[fault]
    assert f"check {check!r}" in failure and where in failure.split("where:")[1].split("\n")[0], failure
    assert HINTED.get(fault, "") in failure.split("hint:")[1], failure


def test_every_lab_has_four_faults_and_every_fault_is_pinned():
    for lab_id in LABS:
        assert sum(1 for f in FAULTS.values() if f[0] == lab_id) >= 4, lab_id
    assert set(CAUGHT_BY) == set(FAULTS)


@pytest.mark.parametrize("fault, scenario", [("hash-xor-chain", "swapped-blocks"), ("hash-unchained", "shared-suffix")])
def test_a_different_chaining_gives_wrong_hits_in_the_engine(fault, scenario):
    """Past the digest check: the engine scenario sees the wrong prefix-cache hit itself."""
    _, _, lines = _grade(7, fault=fault)
    failure = next((line for line in lines if f"check '{scenario}: prefix-cache hits" in line), lines)
    assert "num_cached_tokens" in failure and ("expected: 8" in failure or "expected: 0" in failure), failure


@pytest.mark.parametrize("fault, check, where", [
    ("new-tokens-model-len-off-by-one", "up to max_model_len: schedule = reference", "tokens scheduled"),
    ("ngram-ignores-max-model-len", "n-gram speculation: drafts and tokens = reference", "drafts proposed")])
def test_speculation_faults_show_in_the_engine_too(fault, check, where):
    """Past the unit checks: a draft at the last position, or drafts past max_model_len, change the engine's own
    schedule (requests running to max_model_len 64 with n-gram drafts), and the check names the step."""
    _, _, lines = _grade(FAULTS[fault][0], fault=fault)
    failure = next((line for line in lines if line.startswith(f"FAIL  check {check!r}")), lines)
    assert "where: step " in failure and where in failure, failure


def test_lab_seams_are_the_engine_functions():
    """The functions labs 2-4 replace are the ones the engine calls: ours, unpatched, equal the exercises'."""
    import numpy as np
    from minivllm.attention import layer
    from minivllm.core.sched.scheduler import Scheduler
    from minivllm.labs.exercises.lab03_input_packing import pack_indices
    from minivllm.worker import gpu_model_runner
    assert LABS[2].fixed == {"_num_new_tokens": Scheduler._num_new_tokens, "_select_victim": Scheduler._select_victim}
    assert callable(layer.get_attention_context)
    from minivllm.sample.rejection_sampler import RejectionSampler
    from minivllm.spec_decode.ngram_proposer import NgramProposer
    assert LABS[9].targets == {"rejection_sample": [(RejectionSampler, "__call__")]}  # the runner calls its instance
    assert LABS[10].targets == {"propose": [(NgramProposer, "propose")]}
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.engine.output_processor import OutputProcessor
    from minivllm.models.linear import RowParallelLinear
    assert LABS[12].targets == {"get_computed_blocks": [(KVCacheManager, "get_computed_blocks")]}
    assert LABS[13].targets == {"_check_stop_strings": [(OutputProcessor, "_check_stop_strings")]}
    assert LABS[14].targets == {n: [(RowParallelLinear, n)] for n in ("weight_loader", "local_bias", "forward")}
    assert LABS[11].targets == {"_num_new_tokens": [(Scheduler, "_num_new_tokens")]} and \
        LABS[11].engine_functions()["_num_new_tokens"] is LABS[2].fixed["_num_new_tokens"]  # one function, two labs
    args = (np.array([1, 3]), np.array([9, 0]), np.array([[4, 2, 7], [1, 0, 0]]), np.array([10, 5]), 4)
    for e, g in zip(gpu_model_runner.pack_indices(*args), pack_indices(*args)):
        assert np.asarray(e).tolist() == np.asarray(g).tolist()


@pytest.mark.parametrize("lab_id", sorted(LABS))
def test_student_stub_fails_naming_the_function(lab_id, student_dir):
    passed, total, lines = _grade(lab_id, student_dir / "exercises", first_failure=True)
    assert passed < total
    failure = next(line for line in lines if line.startswith("FAIL"))
    assert "NotImplementedError" in failure
    assert any(f"write {name}:" in failure for name in LABS[lab_id].functions), failure


def test_student_copies_hold_no_solution_and_no_hidden_tests(tmp_path):
    written = write_student_copies(tmp_path, EXERCISES, None)
    assert {p.name for p in written} == {p.name for p in EXERCISES.glob("lab*.py")}
    text = "".join(p.read_text() for p in written)
    assert "self.waiting.prepend_request(request)" not in text  # lab 2's reference line
    assert "BEGIN SOLUTION" not in text and "BEGIN HIDDEN TESTS" not in text


def test_notebook_solution_becomes_none(tmp_path):
    from minivllm.labs.student import stub_cell
    cell = "N = 3\n### BEGIN SOLUTION\nMY_ANSWER = 6\n### END SOLUTION\ncheck(MY_ANSWER)"
    assert stub_cell(cell) == "N = 3\nMY_ANSWER = None  # your prediction\ncheck(MY_ANSWER)"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "minivllm.labs", *args], capture_output=True, text=True,
                          timeout=300)


def test_list_json_shape():
    result = _cli("list", "--json", "--faults")
    data = json.loads(result.stdout)
    assert [lab["id"] for lab in data["labs"]] == sorted(LABS) and all("title" in lab for lab in data["labs"])
    assert len(data["faults"]) >= 8
    assert all(set(f) == {"name", "lab", "what it breaks"} for f in data["faults"])


def test_students_see_no_fault_and_instructors_see_them_all():
    """Issue 47: `list` (what `make lab` prints), `list --json` and `check --help` name no fault; `list --faults`
    names every one."""
    from minivllm.labs.faults import FAULTS
    student = _cli("list").stdout + _cli("list", "--json").stdout + _cli("check", "--help").stdout
    assert not [name for name in FAULTS if name in student], student
    assert not [f[3] for f in FAULTS.values() if f[3][:40] in student]
    instructor = _cli("list", "--faults").stdout
    assert all(name in instructor for name in FAULTS)


def test_bad_lab_and_unknown_fault_exit_2():
    bad = _cli("check", "99")
    assert bad.returncode == 2 and "choose one of" in bad.stderr
    unknown = _cli("check", "2", "--inject", "no-such-fault")
    assert unknown.returncode == 2 and "list --faults" in unknown.stderr and "preempt-append" not in unknown.stderr


def test_grade_writes_one_row_per_student_and_lab_and_feedback(tmp_path, student_dir):
    shutil.copytree(EXERCISES, tmp_path / "class" / "alice" / "exercises")
    shutil.copytree(student_dir / "exercises", tmp_path / "class" / "bob" / "exercises")
    result = _cli("grade", str(tmp_path / "class"), "--csv", str(tmp_path / "grades.csv"), "--labs", "7")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = list(csv.DictReader(open(tmp_path / "grades.csv")))
    assert [(r["student"], r["lab"], r["score"]) for r in rows] == [("alice", "7", "1.00"), ("bob", "7", "0.00")]
    bob = (tmp_path / "grades_feedback" / "bob.txt").read_text()
    assert "## lab 7" in bob and "NotImplementedError" in bob and "write hash_block_tokens" in bob, bob
    assert (tmp_path / "grades_feedback" / "alice.txt").read_text().count("ok    ") == len(LABS[7].checks)


def test_check_stops_at_the_first_failure_and_skips_the_rest(tmp_path, student_dir):
    result = _cli("check", "7", "--submission", str(student_dir / "exercises"))
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0].startswith("FAIL") and all(line.startswith("skip") for line in lines[1:-1]), result.stdout
    assert lines[-1] == f"lab 7: 0/{len(LABS[7].checks)} checks passed  score 0.00"


def test_student_notebooks_have_no_answers_and_no_outputs(tmp_path):
    import nbformat
    from pathlib import Path
    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    write_student_copies(tmp_path, EXERCISES, notebooks)
    for path in sorted((tmp_path / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(not c.outputs and c.execution_count is None for c in code), path.name
        assert not any("BEGIN SOLUTION" in c.source for c in code), path.name
