"""The article's packing example through the real model runner's _prepare_inputs.

A prefills 4 tokens; B and C decode at positions 50 and 30. block_size = 16.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from minivllm.core.sched.output import CachedRequestData, NewRequestData, SchedulerOutput
from minivllm.forward_context import set_forward_context
from minivllm.models.loader import get_model, load_config
from minivllm.sampling_params import SamplingParams
from minivllm.worker.gpu_model_runner import GPUModelRunner

A = [101, 102, 103, 104]
B = list(range(1000, 1051))  # 51 tokens: 50 already in the cache, B0 = B[50] runs now at position 50
C = list(range(2000, 2031))  # 31 tokens: C0 = C[30] at position 30
BLOCKS = {"A": [3], "B": [9, 4, 12, 7], "C": [5, 11]}  # scattered, as a real pool hands them out


@pytest.fixture(scope="module")
def runner(tiny_llama_folder):
    config = load_config(tiny_llama_folder)
    model = get_model(tiny_llama_folder, config, 512, torch.float32, "cpu")
    return GPUModelRunner(model, block_size=16, num_gpu_blocks=16, max_num_reqs=8, max_model_len=512,
                          attention_backend="torch")


def article_step() -> SchedulerOutput:
    params = SamplingParams(temperature=0)
    new = [NewRequestData("A", A, params, BLOCKS["A"], 0), NewRequestData("B", B, params, BLOCKS["B"], 50),
           NewRequestData("C", C, params, BLOCKS["C"], 30)]
    return SchedulerOutput(new, CachedRequestData(), {"A": 4, "B": 1, "C": 1}, 6, set())


def test_packing_matches_the_article(runner):
    so = article_step()
    runner._update_states(so)
    batch = runner._prepare_inputs(so)
    assert batch.input_ids.tolist() == [A[0], A[1], A[2], A[3], B[50], C[30]]  # [A0, A1, A2, A3, B0, C0]
    assert batch.positions.tolist() == [0, 1, 2, 3, 50, 30]
    assert batch.num_scheduled_tokens.tolist() == [4, 1, 1]
    assert batch.query_start_loc.tolist() == [0, 4, 5, 6]
    assert batch.seq_lens.tolist() == [4, 51, 31]
    assert batch.logits_indices.tolist() == [3, 4, 5]  # one hidden state per request reaches lm_head
    block_size = 16
    expected_slots = []
    for req, pos in [("A", 0), ("A", 1), ("A", 2), ("A", 3), ("B", 50), ("C", 30)]:
        table = BLOCKS[req]
        expected_slots.append(table[pos // block_size] * block_size + pos % block_size)
    assert batch.slot_mapping.tolist() == expected_slots == [48, 49, 50, 51, 114, 190]
    assert batch.block_table[1].tolist() == [9, 4, 12, 7]  # B's row: physical = block_table[logical]
    for req_id in "ABC":
        runner.input_batch.remove_request(req_id)


def test_partial_prefill_chunk_samples_nothing(runner):
    params = SamplingParams(temperature=0)
    so = SchedulerOutput([NewRequestData("P", list(range(200, 220)), params, [1, 2], 0)], CachedRequestData(),
                         {"P": 8}, 8, set())
    out = runner.execute_model(so)
    assert out.sampled_token_ids == [[]]  # 8 of 20 prompt tokens: no logits, no token
    so = SchedulerOutput([], CachedRequestData(["P"], [False], [None], [[]], [8]), {"P": 12}, 12, set())
    out = runner.execute_model(so)
    assert len(out.sampled_token_ids[0]) == 1  # the chunk that reaches the end samples
    runner.execute_model(SchedulerOutput([], CachedRequestData(), {}, 0, {"P"}))
    assert "P" not in runner.input_batch.req_id_to_row


def test_the_articles_worked_example_sits_beside_the_index_arithmetic_and_holds():
    """A prefills 4 tokens, B and C decode at positions 50 and 30 (block_size 16, the article's numbers)."""
    import inspect

    from minivllm.worker.gpu_model_runner import pack_indices
    tables = np.array([[3, 0, 0, 0], [9, 4, 12, 7], [5, 11, 0, 0]])
    got = pack_indices(np.array([4, 1, 1]), np.array([0, 50, 30]), tables, np.array([4, 51, 31]), 16)
    qsl, req_indices, positions, slots, sampling, logits_indices = (a.tolist() for a in got)
    assert (qsl, positions, logits_indices) == ([0, 4, 5, 6], [0, 1, 2, 3, 50, 30], [3, 4, 5])
    assert req_indices == [0, 0, 0, 0, 1, 2] and slots == [48, 49, 50, 51, 114, 190] and sampling == [0, 1, 2]
    for function in (pack_indices, GPUModelRunner._prepare_inputs):
        examples = [line.strip() for line in inspect.getsource(function).splitlines() if "# E.g." in line]
        assert any("[0, 1, 2, 3, 50, 30]" in line for line in examples), function.__name__
        assert any("[0, 4, 5, 6]" in line for line in examples), function.__name__



def test_the_model_returns_every_row_and_the_runner_picks_logits_indices(runner):
    """The article's part 6: the model computes a hidden state for every scheduled token (the last layer's MLP
    sees all 6 rows of the worked example), then `hidden_states[logits_indices]` picks the 3 rows lm_head reads."""
    seen, heads = [], []
    model = runner.get_model()
    hooks = [model.model.layers[-1].mlp.register_forward_pre_hook(lambda mod, args: seen.append(len(args[0]))),
             model.lm_head.register_forward_pre_hook(lambda mod, args: heads.append(len(args[0])))]
    original = model.compute_logits
    model.compute_logits = lambda rows: heads.append(len(rows)) or original(rows)
    try:
        so = article_step()
        runner._update_states(so)
        b = runner._prepare_inputs(so)
        md = runner._attn_metadata(b)
        with torch.inference_mode(), set_forward_context(md, runner.attn_layers, b.slot_mapping):
            full = runner.model(b.input_ids, b.positions)
        assert seen == [6] and full.shape[0] == 6
        runner.execute_model(SchedulerOutput([], CachedRequestData(), {}, 0, {"A", "B", "C"}))
        seen.clear()
        heads.clear()
        out = runner.execute_model(article_step())
        assert seen == [6] and heads == [3] and [len(t) for t in out.sampled_token_ids] == [1, 1, 1]
        runner.execute_model(SchedulerOutput([], CachedRequestData(), {}, 0, {"A", "B", "C"}))
    finally:
        del model.compute_logits
        for hook in hooks:
            hook.remove()
