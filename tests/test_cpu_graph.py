"""CPU graphs (minivllm/compilation/cpu_graph.py): decode steps replayed from recorded C calls.

A replay must give bit for bit what the eager forward gives, at every batch size, in float32 and bfloat16;
setups a replay cannot serve must run eagerly (and say why); the arena must never let two live tensors share
bytes; a recording that is not a pure function of the row count must be refused."""
from __future__ import annotations

import random

import pytest
import torch

from minivllm import LLM, SamplingParams, _C
from minivllm.compilation.recorder import ROWS, At, CaptureRefused, Trace, derive_template, place, regions
from minivllm.compilation.cpu_graph import CPUGraphWrapper


def _runner(llm):
    return llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner


def _generate(llm):
    # 9 requests of different lengths: the decode batches shrink from 9 to 1 as they finish.
    prompts = [[3 + i] * (5 + 11 * i) for i in range(9)]
    params = [SamplingParams(temperature=0, max_tokens=4 + 3 * i, ignore_eos=True, logprobs=3) for i in range(9)]
    outs = llm.generate(prompts, params, use_tqdm=False)
    return [(o.outputs[0].token_ids, [sorted((k, v.logprob) for k, v in d.items()) for d in o.outputs[0].logprobs])
            for o in outs]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_replayed_decode_steps_match_the_eager_forward_bit_for_bit(tiny_llama_folder, dtype):
    if not _C.available():
        pytest.skip("no compiled CPU ops")
    kw = dict(multiprocess=False, max_model_len=256, dtype=dtype, enable_prefix_caching=False)
    eager = LLM(str(tiny_llama_folder), enforce_eager=True, **kw)
    assert not isinstance(_runner(eager).model, CPUGraphWrapper)
    expected = _generate(eager)
    graphed = LLM(str(tiny_llama_folder), **kw)
    graph = _runner(graphed).model
    got = _generate(graphed)
    assert got == expected  # tokens and logprobs, exactly
    if dtype == "bfloat16" and not _C.linear_bf16_tile():  # bf16 GEMMs on oneDNN: a torch op, refused
        assert graph.template is None and graph.num_replays == 0
        return
    assert graph.template.sizes == range(1, 257)
    assert graph.num_replays >= 20 and graph.sizes_replayed == set(range(1, 10))  # every size 1..9


def test_smollm2_bf16_replays_match_eager(smollm_folder):
    if not (_C.available() and _C.linear_bf16_tile() > 0):
        pytest.skip("the bf16 C GEMM needs AVX-512")
    kw = dict(multiprocess=False, max_model_len=256, dtype="bfloat16", enable_prefix_caching=False)
    expected = _generate(LLM(str(smollm_folder), enforce_eager=True, **kw))
    graphed = LLM(str(smollm_folder), **kw)
    assert _generate(graphed) == expected
    assert _runner(graphed).model.num_replays >= 20


def test_setups_a_replay_cannot_serve_run_eagerly(tiny_llama_folder, tiny_opt_folder, monkeypatch):
    kw = dict(multiprocess=False, max_model_len=128)
    assert not isinstance(_runner(LLM(str(tiny_llama_folder), attention_backend="torch", **kw)).model, CPUGraphWrapper)
    assert not isinstance(_runner(LLM(str(tiny_opt_folder), **kw)).model, CPUGraphWrapper)  # no inputs_embeds path
    if not _C.available():
        return
    # A norm in PyTorch is an op a replay would skip: the capture is refused, every step runs eagerly.
    from minivllm.models.layers import RMSNorm
    expected = _generate(LLM(str(tiny_llama_folder), enforce_eager=True, **kw))
    monkeypatch.setattr(RMSNorm, "forward_cpu", RMSNorm.forward_native)
    llm = LLM(str(tiny_llama_folder), **kw)
    graph = _runner(llm).model
    assert graph is not None and graph.template is None
    got = _generate(llm)
    assert graph.num_replays == 0
    assert [t for t, _ in got] == [t for t, _ in expected]


def test_place_never_lets_two_live_buffers_share_bytes():
    rng = random.Random(0)
    for _ in range(200):
        lifetimes = []
        for _ in range(rng.randint(1, 30)):
            first = rng.randint(0, 40)
            lifetimes.append((rng.randint(1, 5000), first, first + rng.randint(0, 10)))
        offsets, total = place(lifetimes)
        spans = [(o, o + n) for o, (n, _, _) in zip(offsets, lifetimes)]
        assert all(o % 64 == 0 and e <= total for o, e in spans)
        for i, (_, f1, l1) in enumerate(lifetimes):
            for j, (_, f2, l2) in enumerate(lifetimes[:i]):
                if not (l1 < f2 or l2 < f1):  # both live at some call
                    assert spans[i][1] <= spans[j][0] or spans[j][1] <= spans[i][0]
    # two buffers used one after the other share their bytes
    assert place([(1000, 0, 1), (1000, 2, 3)]) == ([0, 0], 1024)


def _trace(rows: int, kept_input: torch.Tensor, hidden: int = 8):
    """A hand-made recording of one silu_and_mul: out [rows, hidden] = f(x [rows, 2 * hidden])."""
    x, out = torch.empty(rows, 2 * hidden), torch.empty(rows, hidden)
    src = kept_input if kept_input is not None else x
    return Trace([("silu_and_mul", (out.data_ptr(), src.data_ptr(), rows, hidden, 0))], [x, out], out)


def test_derive_template_patches_the_row_count_and_refuses_anything_else():
    template = derive_template([_trace(16, None), _trace(2, None)], (16, 2), regions([]))
    (name, args), = template.calls
    assert name == "silu_and_mul" and type(args[0]) is At and type(args[1]) is At and args[2] is ROWS
    assert args[3:] == (8, 0) and template.sizes == range(1, 17)
    assert template.arena_bytes == 16 * 8 * 4 + 16 * 16 * 4  # both buffers live in the one call
    # a pointer into memory that is neither the forward's own nor kept between steps
    stray = torch.empty(16, 16)
    with pytest.raises(CaptureRefused, match="not kept"):
        derive_template([_trace(16, stray), _trace(2, stray)], (16, 2), regions([]))
    derive_template([_trace(16, stray), _trace(2, stray)], (16, 2), regions([stray]))  # kept: fine
    # an argument that changes with the rows other than as them
    a, b = _trace(16, None), _trace(2, None)
    b.calls[0] = ("silu_and_mul", b.calls[0][1][:3] + (9, 0))
    with pytest.raises(CaptureRefused, match="argument 3 of silu_and_mul"):
        derive_template([a, b], (16, 2), regions([]))


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3])
def test_few_sequences_record_once_and_serve_that_size(tiny_llama_folder, max_num_seqs):
    if not _C.available():
        pytest.skip("no compiled CPU ops")
    kw = dict(multiprocess=False, max_model_len=256, max_num_seqs=max_num_seqs, enable_prefix_caching=False)
    expected = _generate(LLM(str(tiny_llama_folder), enforce_eager=True, **kw))
    llm = LLM(str(tiny_llama_folder), **kw)
    assert _generate(llm) == expected
    graph = _runner(llm).model
    # below three sequences one recording, serving its own size; from three, every size 1..max
    sizes = range(1, 4) if max_num_seqs == 3 else range(max_num_seqs, max_num_seqs + 1)
    assert graph.template.sizes == sizes and graph.num_replays > 0


def test_a_recording_writes_the_calls_down_without_running_them():
    # A capture costs no arithmetic: the forward's C calls (all returning nothing) are written down, not run;
    # a function that answers something (panel_width) is the library's own.
    from minivllm.compilation.recorder import Recording

    class Library:
        def __getattr__(self, name):
            if name == "panel_width":
                return lambda: 32
            raise AssertionError(f"the recording ran {name}")

    recording = Recording(Library())
    recording.silu_and_mul(1, 2, 3, 4, 0)
    assert recording.calls == [("silu_and_mul", (1, 2, 3, 4, 0))] and recording.panel_width() == 32
