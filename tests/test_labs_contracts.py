"""The stubs' docstrings are contracts, and their worked examples are true; hidden tests stay hidden.

Every function a lab asks for documents an example and its invariants (or the state after the call, or its
rules). The worked examples of labs 3, 4, 5 and 8 are recomputed here with the engine's own functions: each
number the docstring states is checked against what the engine gives. Lab 8 holds hidden tests: the student
copy drops them, the grader runs them on a submission (a slip only they catch is a failed check whose message
shows no expected value), and the reference passes them.
"""
from __future__ import annotations

import ast
import textwrap
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minivllm.attention import layer as attention_layer
from minivllm.attention.backends import torch_attn
from minivllm.forward_context import set_forward_context
from minivllm.labs import grader, student
from minivllm.labs.grader import EXERCISES, check_lab
from minivllm.labs.registry import LABS
from minivllm.sample import sampler
from minivllm.worker import gpu_model_runner

pytestmark = pytest.mark.timeout(300)
CONTRACT_WORDS = ("Invariants", "After the call", "Rules", "rules")


def _docs(path) -> dict[str, str]:
    """{function name: its docstring} for the module-level functions of an exercise file (hidden tests aside)."""
    tree = ast.parse(path.read_text())
    return {node.name: ast.get_docstring(node) or "" for node in tree.body
            if isinstance(node, ast.FunctionDef) and not node.name.startswith("hidden_test_")}


def _doc(lab_id: int, function: str) -> str:
    """The docstring on one line (the examples wrap across lines)."""
    return " ".join(_docs(EXERCISES / f"{LABS[lab_id].module}.py")[function].split())


@pytest.mark.parametrize("path", sorted(EXERCISES.glob("lab*.py")), ids=lambda p: p.stem)
def test_every_function_of_every_lab_has_a_contract_and_an_example(path):
    docs = _docs(path)
    lab = next(lab for lab in LABS.values() if lab.module == path.stem)
    assert set(lab.functions) <= set(docs), (path.name, lab.functions)
    for name, doc in docs.items():
        assert "Example" in doc, (path.name, name)
        assert any(word in doc for word in CONTRACT_WORDS), (path.name, name)
        assert "Input" in doc or "After the call" in doc, (path.name, name)


def test_lab3_example_is_what_the_runner_packs():
    doc = _doc(3, "pack_indices")
    assert ("num_scheduled [1, 3], num_computed [5, 4], num_tokens [6, 10], block_table [[2, 7, 0], [5, 1, 3]]"
            in doc and "Example (block_size 4)" in doc)
    i64 = lambda x: np.array(x, dtype=np.int64)  # noqa: E731
    got = gpu_model_runner.pack_indices(i64([1, 3]), i64([5, 4]), i64([[2, 7, 0], [5, 1, 3]]), i64([6, 10]), 4)
    names = ("query_start_loc", "req_indices", "positions", "slot_mapping", "sampling", "logits_indices")
    for name, value in zip(names, got):
        assert f"{name} {np.asarray(value).tolist()}" in doc, (name, value)


def test_lab4_example_is_what_the_layer_pulls():
    doc = _doc(4, "get_attention_context")
    assert ('set_forward_context(md, {"layers.0.attn": L0, "layers.1.attn": L1}, '
            'slot_mapping={"layers.0.attn": s0, "layers.1.attn": s1}) with s1 = tensor([8, 9, 10])' in doc)
    assert 'get_attention_context("layers.1.attn") -> (md, L1, L1.kv_cache, s1)' in doc
    md = SimpleNamespace(num_actual_tokens=3)
    layers = {n: SimpleNamespace(kv_cache=torch.zeros(i + 1)) for i, n in enumerate(["layers.0.attn", "layers.1.attn"])}
    slots = {"layers.0.attn": torch.tensor([0, 1, 2]), "layers.1.attn": torch.tensor([8, 9, 10])}
    with set_forward_context(md, layers, slot_mapping=slots):
        got = attention_layer.get_attention_context("layers.1.attn")
    want = (md, layers["layers.1.attn"], layers["layers.1.attn"].kv_cache, slots["layers.1.attn"])
    assert len(got) == 4 and all(a is b for a, b in zip(got, want))
    assert f"its slot_mapping is {got[3].tolist()}" in doc


def test_lab5_examples_are_what_the_torch_backend_writes_and_reads():
    write, read = _doc(5, "do_kv_cache_update"), _doc(5, "gather_blocks")
    assert ("Example (block_size 2, 3 blocks, 1 head, head_size 1): key [10, 20, 30], value [-10, -20, -30], "
            "slots [5, -1, 0] on a zero cache" in write)
    key = torch.tensor([10.0, 20.0, 30.0]).view(3, 1, 1)
    cache = torch.zeros(2, 3, 2, 1, 1)
    torch_attn.TorchAttentionImpl.do_kv_cache_update(None, key, -key, cache, torch.tensor([5, -1, 0]))
    k_flat, v_flat = (cache[i].flatten().int().tolist() for i in (0, 1))
    assert f"kv_cache[0] flattened is {k_flat}" in write and f"kv_cache[1] is {v_flat}" in write
    assert f"flattened {k_flat}" in read and "gather_blocks(cache, tensor([[2, 0]]))" in read
    got = torch_attn.gather_blocks(cache[0], torch.tensor([[2, 0]]))
    assert f"has shape {list(got.shape)} and flattened is {got.flatten().int().tolist()}" in read


def test_lab8_example_is_what_the_sampler_masks():
    doc = _doc(8, "apply_top_k_top_p")
    assert "Example: both rows [1.0, 2.0, 3.0, 4.0], top_k [2, 0], top_p [0.7, 0.7] -> " in doc
    logits = torch.tensor([[1.0, 2.0, 3.0, 4.0]] * 2)
    got = sampler.apply_top_k_top_p(logits.clone(), torch.tensor([2, 0]), torch.tensor([0.7, 0.7]))
    assert f"-> {got.tolist()}" in doc
    kept = torch.tensor([3.0, 4.0]).softmax(-1).tolist()[::-1]  # row 0: masses of 4 and 3 after top-k
    every = logits[1].softmax(-1).flip(0)[:2].tolist()  # row 1: the two best masses, no top-k
    assert f"masses {kept[0]:.2f} and {kept[1]:.2f}" in doc and f"masses are {every[0]:.2f}, {every[1]:.2f}" in doc


# -- hidden tests ------------------------------------------------------------------------------------------
LAB8 = EXERCISES / f"{LABS[8].module}.py"


def test_lab8_has_hidden_tests_and_both_references_pass_them():
    block, tests = student.hidden_tests(LAB8.read_text())
    assert len(tests) >= 3 and all(what for _, what in tests)
    from minivllm.labs.exercises import lab08_top_k_top_p
    for function in (sampler.apply_top_k_top_p, lab08_top_k_top_p.apply_top_k_top_p):
        scope = {"torch": torch, "apply_top_k_top_p": function}
        exec(compile(block, str(LAB8), "exec"), scope)  # noqa: S102 - our own exercise file
        for name, _ in tests:
            scope[name]()


def test_the_student_copy_has_no_hidden_tests(tmp_path, capsys):
    from minivllm.labs.__main__ import main
    assert main(["student", str(tmp_path)]) == 0
    copy = (tmp_path / "exercises" / LAB8.name).read_text()
    assert "hidden_test_" not in copy and student.BEGIN_HIDDEN not in copy and student.END_HIDDEN not in copy
    assert student.hidden_tests(copy) == ("", [])
    assert "def apply_top_k_top_p" in copy and "Example" in copy  # the contract stays


def test_the_grader_runs_the_hidden_tests_on_the_reference(monkeypatch):
    lab = LABS[8]
    job = {"lab": 8, "fault": None, "timeout": 60.0, "memory_mb": 2048, "mode": "exercise",
           "path": str(LAB8), "source": LAB8.read_text()}
    sources = []
    real_run = grader._run
    monkeypatch.setattr(grader, "_run", lambda job, check: sources.append(job["source"]) or real_run(job, check))
    grader._hidden(lab, lab.checks[0][0], job)  # raises _Failed if any fails
    assert [s.rsplit("\n", 2)[-2] for s in sources] == [f"{name}()" for name, _ in student.hidden_tests(
        LAB8.read_text())[1]]


_SLIP = '''
import torch


def apply_top_k_top_p(logits, top_k, top_p):
    vocab = logits.shape[1]
    if top_k is not None and bool((top_k > vocab).any()):
        {slip}
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        before = probs.cumsum(dim=-1) - probs
        sorted_logits = sorted_logits.masked_fill(before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
'''


def _check_slip(tmp_path, slip: str) -> list[str]:
    """Lab 8 graded on a submission right on every visible case, wrong when top_k exceeds the vocabulary (the
    visible cases stop at top_k == vocab); stops at the first failed check, before any engine is built."""
    path = tmp_path / LAB8.name
    path.write_text(textwrap.dedent(_SLIP).replace("{slip}", slip))
    lines = []
    assert check_lab(8, path, out=lines.append, first_failure=True) == (0, len(LABS[8].checks))
    return lines


def test_a_slip_only_a_hidden_test_catches_fails_without_showing_the_expected_value(tmp_path):
    lines = _check_slip(tmp_path, "return logits.clamp(max=0.0)")
    first = lines[0]
    assert first.startswith("FAIL  check 'masks = formula': hidden case 1 of "), lines  # the visible cases passed
    assert "top_k larger than the vocabulary" in first and "not the expected one" in first
    assert "expected:" not in first and "0.5" not in first and "tensor" not in first, first  # no values shown
    assert lines[1].startswith("skip")


def test_an_error_in_the_submission_during_a_hidden_case_names_its_own_line(tmp_path):
    lines = _check_slip(tmp_path, 'raise ValueError("k above the vocabulary")')
    assert "hidden case 1 of" in lines[0] and "ValueError: k above the vocabulary" in lines[0], lines
    assert f"(at {LAB8.name}:8)" in lines[0], lines
