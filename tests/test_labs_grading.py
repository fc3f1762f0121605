"""How the grader grades: unit checks first and runnable without the model, the reference observations cached on
disk, the grader's own loops bounded in steps (a slip fails a check, never hangs), errors located in the student's
file, and the handout (a page per lab, notebooks without the answers).
"""
from __future__ import annotations

import textwrap

import pytest

from minivllm.labs import grader, refcache
from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.faults import FAULTS
from minivllm.labs.grader import EXERCISES, check_lab
from minivllm.labs.harness import needs_engine, plugged
from minivllm.labs.registry import LABS

pytestmark = pytest.mark.timeout(300)


def _submit(tmp_path, lab_id, source):
    folder = tmp_path / "s"
    folder.mkdir(exist_ok=True)
    (folder / f"{LABS[lab_id].module}.py").write_text(source)
    return folder


def _unit_checks(lab):
    return [(i, c) for i, c in enumerate(lab.checks) if not needs_engine(c[1])]


@pytest.mark.parametrize("lab_id", sorted(LABS))
def test_unit_checks_come_first(lab_id):
    kinds = [needs_engine(observe) for _, observe, _ in LABS[lab_id].checks]
    assert kinds == sorted(kinds), [c[0] for c in LABS[lab_id].checks]  # every False before every True


@pytest.mark.parametrize("lab_id", sorted(LABS))
def test_unit_checks_run_without_an_engine_and_pass_the_reference(lab_id):
    """In this process, no model: a unit check of the engine's own functions passes its own judge, and the
    lab's faults fail one of them or reach the engine's checks."""
    lab = LABS[lab_id]
    ours = lab.engine_functions()
    for _, (name, observe, judge) in _unit_checks(lab):
        obs = {}
        with plugged(lab, ours):
            observe(ours, None, obs)
        judge(obs, obs)


def test_unit_cases_come_at_block_sizes_4_8_and_16():
    """A constant 4 where block_size belongs fails a unit check (labs 2, 3, 5, 6, 7)."""
    from minivllm.labs import unit_checks as uc, unit_hash as uh, unit_sched as us
    for sizes in ([c[4] for c in uc._LAB3_CASES], [c[0] for c in uc._LAB5_CASES], list(us.BLOCK_SIZES),
                  [c[0] for c in uh._CHAINS]):
        assert {4, 8, 16} <= set(sizes), sizes


def test_the_reference_is_cached_on_disk_keyed_by_the_code(tmp_path, monkeypatch):
    monkeypatch.setenv("MINIVLLM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(grader, "_REFERENCE", {})
    runs = []
    real_run = grader._run
    monkeypatch.setattr(grader, "_run", lambda job, check: runs.append(job["mode"]) or real_run(job, check))
    assert check_lab(8, out=lambda line: None) == (2, 2)
    assert runs.count("engine") == 2 and len(list(refcache.folder().glob("lab08-*.json"))) == 2
    runs.clear()
    monkeypatch.setattr(grader, "_REFERENCE", {})  # a new grader process: only the disk is left
    assert check_lab(8, out=lambda line: None) == (2, 2)
    assert runs.count("engine") == 0, runs
    monkeypatch.setattr(refcache, "_FINGERPRINT", "another-engine")  # the engine changed: recomputed
    monkeypatch.setattr(grader, "_REFERENCE", {})
    assert check_lab(8, out=lambda line: None) == (2, 2)
    assert runs.count("engine") == 2


def test_a_generate_loop_that_never_ends_fails_at_the_step_bound(tmp_path):
    """A plausible lab 1 slip (an off-by-one in the loop's exit test) fails 'terminates' at the grader's step
    bound, with the loop's own line named, instead of hanging or waiting for the time bound."""
    source = textwrap.dedent("""
        def generate_loop(engine, prompts, params):
            ids = [engine.next_request_id() for _ in prompts]
            for rid, prompt in zip(ids, prompts):
                engine.add_request(rid, prompt, params)
            done = {}
            while len(done) <= len(prompts):
                for output in engine.step():
                    if output.finished:
                        done[output.request_id] = output
            return [done[r] for r in ids]
    """)
    lines = []
    passed, _ = check_lab(1, _submit(tmp_path, 1, source), out=lines.append, first_failure=True)
    text = "\n".join(lines)
    assert passed == 0 and "(at check 'terminates')" in text and "did not finish within" not in text, text


def test_an_error_points_at_the_deepest_line_of_the_students_file(tmp_path):
    source = textwrap.dedent("""
        def _pack(tokens):
            return [t // 0 for t in tokens]


        def hash_block_tokens(parent_block_hash, curr_block_token_ids):
            return bytes(_pack(curr_block_token_ids))
    """)
    lines = []
    check_lab(7, _submit(tmp_path, 7, source), out=lines.append, first_failure=True)
    assert "ZeroDivisionError" in lines[0] and "(at lab07_block_hash.py:3)" in lines[0], lines[0]


def test_an_error_in_the_engine_says_it_is_not_in_the_students_file():
    text = grader._error_text({"type": "IndexError", "message": "index 9", "where": "gpu_model_runner.py:181",
                               "in_submission": False, "student": True}, 2048)
    assert "gpu_model_runner.py:181, in the engine, not in your file" in text


def test_the_handout_has_a_page_per_lab_and_no_answers(tmp_path):
    import nbformat
    from minivllm.labs.handout import write_pages
    from minivllm.labs.student import WHY, is_answer_cell, write_student_copies
    from pathlib import Path
    written = write_pages(tmp_path, LABS)
    assert {p.name for p in (tmp_path / "labs").glob("*.md")} == {f"lab{n:02d}.md" for n in LABS}
    for lab in LABS.values():
        page = (tmp_path / "labs" / f"lab{lab.id:02d}.md").read_text()
        for part in ("**Goal.**", f"check {lab.id} --submission", "**What the checks prove.**",
                     "**The edge case to think about.**", f"About {lab.minutes} minutes"):
            assert part in page, (lab.id, part)
        assert all(name in page for name, *_ in lab.checks)
    assert written[0].name == "README.md"
    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    originals = {p.name: nbformat.read(p, as_version=4) for p in notebooks.glob("0[1-79]_*.ipynb")}
    write_student_copies(tmp_path, EXERCISES, notebooks)
    for name, original in originals.items():
        why = [c.source for c in original.cells if is_answer_cell(c)]
        student = [c.source for c in nbformat.read(tmp_path / "notebooks" / name, as_version=4).cells
                   if c.cell_type == "markdown" and c.source.startswith(WHY)]
        assert why and len(student) == len(why), name
        assert not set(why) & set(student), name  # the explanation is gone, the prompt for one is there


def test_stub_docstrings_are_contracts_with_an_example():
    for path in sorted([*EXERCISES.glob("lab0[12679]_*.py"), *EXERCISES.glob("lab1?_*.py")]):
        text = path.read_text()
        assert "Example" in text and ("Invariants" in text or "After the call" in text or "rules" in text), path


def test_a_fault_of_an_unknown_kind_is_refused_with_the_names():
    from minivllm.labs import inject
    with pytest.raises(ValueError, match="choose one of"):
        with inject("no-such-fault"):
            pass
    assert all(isinstance(f[2], type(test_stub_docstrings_are_contracts_with_an_example)) for f in FAULTS.values())
    assert LabCheckFailed("c", "w", 1, 2, "h").hint == "h"


def _another_correct_sampler(self, draft_token_ids, target_logits, bonus_token_ids, md):
    """Correct, but with its own use of the generators: every u of a request drawn up front, the replacement by
    torch.multinomial. The statistical checks must pass it (they test the distribution, not our draws); the
    stream check must not (a request's tokens are the engine's exactly, as in vLLM: issue 47)."""
    import torch
    from minivllm.sample.sampler import Sampler
    probs, out, row = Sampler.compute_probs(target_logits.float(), md), [], 0
    for drafts, bonus in zip(draft_token_ids, bonus_token_ids):
        gen = md.generators[row] if drafts else None
        us = torch.rand(len(drafts), generator=gen) if drafts else []
        tokens = []
        for j, d in enumerate(drafts):
            r = row + j
            if md.temperature[r] == 0 and int(target_logits[r].argmax()) != d:
                tokens.append(int(target_logits[r].argmax()))
                break
            if md.temperature[r] > 0 and us[j] >= probs[r, d]:
                residual = probs[r].clone()
                residual[d] = 0
                tokens.append(int(torch.multinomial(residual, 1, generator=gen)))
                break
            tokens.append(d)
        else:
            tokens.append(bonus)
        out.append(tokens)
        row += len(drafts)
    return out


def test_lab9_distribution_checks_accept_any_correct_sampler_and_the_stream_check_only_the_engines_draws():
    from minivllm.labs.unit_stream import CHECK
    lab = LABS[9]
    ours, theirs = lab.engine_functions(), {"rejection_sample": _another_correct_sampler}
    for _, (name, observe, judge) in _unit_checks(lab):
        ref, first, again = {}, {}, {}
        observe(ours, None, ref)
        observe(theirs, None, first)
        observe(theirs, None, again)
        assert first == again, name  # seeded: the same verdict every run
        if name != CHECK:
            judge(first, ref)
        else:
            with pytest.raises(LabCheckFailed, match="seeded: its own generator"):
                judge(first, ref)
