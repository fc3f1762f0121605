"""Labs cannot drift: every lab's reference solution gives the same outputs as the engine function it replaces,
on generated inputs (block sizes 4, 8 and 16, odd lengths), so a change to the engine that the exercise file
does not follow fails here (issue 24).
"""
from __future__ import annotations

import copy
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from minivllm.attention import layer as attention_layer
from minivllm.attention.backends import torch_attn
from minivllm.config import CacheConfig, SchedulerConfig
from minivllm.core import kv_cache_utils
from minivllm.core.sched import scheduler as scheduler_module
from minivllm.core.sched.scheduler import Scheduler
from minivllm.forward_context import set_forward_context
from minivllm.labs import faults_spec
from minivllm.labs.exercises import (lab02_preemption, lab03_input_packing, lab04_forward_context,
                                    lab05_paged_kv, lab06_stop_and_free, lab07_block_hash, lab08_top_k_top_p,
                                    lab09_rejection_sampler, lab10_ngram_proposer, lab11_token_budget)
from minivllm.labs.registry import LABS
from minivllm.request import Request, RequestStatus
from minivllm.sampling_params import SamplingParams
from minivllm.worker import gpu_model_runner

BLOCK_SIZES = [4, 8, 16]


def test_every_lab_function_is_covered_here():
    covered = {"generate_loop", "_preempt_request", "pack_indices", "get_attention_context", "do_kv_cache_update",
               "gather_blocks", "check_stop", "_free_request", "hash_block_tokens", "apply_top_k_top_p",
               "rejection_sample", "propose", "_num_new_tokens", "get_computed_blocks", "_check_stop_strings",
               "weight_loader", "local_bias", "forward"}
    assert {name for lab in LABS.values() for name in lab.functions} == covered


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_lab3_pack_indices_equals_the_runners(block_size):
    rng = np.random.default_rng(block_size)
    for _ in range(50):
        n = int(rng.integers(1, 6))
        computed = rng.integers(0, 3 * block_size + 1, n)
        scheduled = rng.integers(1, 2 * block_size + 2, n)  # odd lengths, chunks that cross blocks
        known = computed + scheduled + rng.integers(0, 3, n)  # 0: this step samples
        max_blocks = int((computed + scheduled).max()) // block_size + 1
        table = rng.permutation(n * max_blocks + 1)[:n * max_blocks].reshape(n, max_blocks).astype(np.int64)
        args = (scheduled.astype(np.int64), computed.astype(np.int64), table, known.astype(np.int64), block_size)
        for e, g in zip(gpu_model_runner.pack_indices(*copy.deepcopy(args)), lab03_input_packing.pack_indices(*args)):
            assert np.asarray(e).tolist() == np.asarray(g).tolist(), args


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_lab5_write_and_read_equal_the_torch_backends(block_size):
    g = torch.Generator().manual_seed(block_size)
    for num_tokens in (1, 7, 13):
        num_blocks = 2 * num_tokens // block_size + 3
        slots = torch.randperm(num_blocks * block_size, generator=g)[:num_tokens]
        slots[::3] = -1  # padding rows
        key, value = torch.randn(num_tokens, 2, 4, generator=g), torch.randn(num_tokens, 2, 4, generator=g)
        ours, theirs = torch.zeros(2, num_blocks, block_size, 2, 4), torch.zeros(2, num_blocks, block_size, 2, 4)
        torch_attn.TorchAttentionImpl.do_kv_cache_update(None, key, value, ours, slots.clone())
        lab05_paged_kv.do_kv_cache_update(None, key, value, theirs, slots.clone())
        assert torch.equal(ours, theirs)
        physical = torch.randint(0, num_blocks, (3, 5), generator=g)
        assert torch.equal(torch_attn.gather_blocks(ours[0], physical), lab05_paged_kv.gather_blocks(ours[0], physical))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_lab7_hash_equals_the_engines(block_size):
    rng = random.Random(block_size)
    ours = theirs = None
    for _ in range(7):
        tokens = [rng.randrange(49152) for _ in range(block_size)]
        ours, theirs = kv_cache_utils.hash_block_tokens(ours, tokens), lab07_block_hash.hash_block_tokens(theirs, tokens)
        assert ours == theirs


@pytest.mark.parametrize("vocab", [37, 50, 101])
def test_lab8_top_k_top_p_equals_the_samplers(vocab):
    from minivllm.sample import sampler
    g = torch.Generator().manual_seed(vocab)
    for _ in range(10):
        logits = torch.randn(5, vocab, generator=g)
        top_k = torch.randint(0, vocab + 3, (5,), generator=g)
        top_p = torch.rand(5, generator=g).clamp(min=0.05)
        top_p[0] = 1.0
        for k, p in ((top_k, None), (None, top_p), (top_k, top_p)):
            assert torch.equal(sampler.apply_top_k_top_p(logits.clone(), k, p),
                               lab08_top_k_top_p.apply_top_k_top_p(logits.clone(), k, p))


@pytest.mark.parametrize("num_layers", [1, 3])
def test_lab4_context_equals_the_layers(num_layers):
    names = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
    layers = {n: SimpleNamespace(layer_name=n, kv_cache=torch.zeros(i + 1)) for i, n in enumerate(names)}
    slots = {n: torch.tensor([i]) for i, n in enumerate(names)}
    with set_forward_context(SimpleNamespace(num_actual_tokens=1), layers, slot_mapping=slots):
        for name in names:
            ours, theirs = attention_layer.get_attention_context(name), lab04_forward_context.get_attention_context(name)
            assert len(ours) == len(theirs) == 4 and all(a is b for a, b in zip(ours, theirs))


def _stop_cases():
    for max_tokens in (1, 2, 3, None):
        for min_tokens in (0, 2) if max_tokens != 1 else (0,):
            for ignore_eos in (False, True):
                for last in (2, 9, 5):  # EOS, a stop token, a plain token
                    for max_model_len in (7, 8192):  # 5 prompt tokens: the length cap at the boundary
                        yield SamplingParams(temperature=0, max_tokens=max_tokens, min_tokens=min_tokens,
                                             ignore_eos=ignore_eos, stop_token_ids=[9]), last, max_model_len


def test_lab6_check_stop_equals_the_schedulers():
    for params, last, max_model_len in _stop_cases():
        for n_out in (1, 2, 3):
            results = []
            for fn in (scheduler_module.check_stop, lab06_stop_and_free.check_stop):
                req = Request("r", [7] * 5, params, 2)
                req.status = RequestStatus.RUNNING
                for t in [5] * (n_out - 1) + [last]:
                    req.append_output_token_ids(t)
                results.append((fn(req, max_model_len), req.status, req.stop_reason))
            assert results[0] == results[1], (params, last, max_model_len, n_out)


def _scheduler_with_running(block_size: int, seed: int):
    """A scheduler (no model: schedule() only) with odd-length requests running, some chunked."""
    rng = random.Random(seed)
    sched = Scheduler(SchedulerConfig(max_num_batched_tokens=3 * block_size + 1, max_model_len=512),
                      CacheConfig(block_size=block_size, num_gpu_blocks=64))
    for i in range(5):
        prompt = [rng.randrange(1, 1000) for _ in range(rng.randrange(1, 3 * block_size, 2))]
        sched.add_request(Request(f"r{i}", prompt, SamplingParams(max_tokens=8), 2))
    out = sched.schedule()
    for req in sched.running:
        req.num_computed_tokens += out.num_scheduled_tokens[req.request_id]
    return sched


def _state(sched) -> tuple:
    pool = sched.kv_cache_manager.block_pool
    reqs = sorted(sched.requests.values(), key=lambda r: r.request_id)
    return (pool.get_num_free_blocks(), [b.ref_cnt for b in pool.blocks], [r.request_id for r in sched.waiting],
            [r.request_id for r in sched.running], sorted(sched.finished_req_ids), sched.num_preemptions,
            [(r.request_id, r.status, r.num_computed_tokens, r.num_preemptions) for r in reqs],
            sorted(sched.kv_cache_manager.req_to_blocks))


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
@pytest.mark.parametrize("fn_name, module", [("_preempt_request", lab02_preemption), ("_free_request",
                                                                                    lab06_stop_and_free)])
def test_lab2_and_lab6_scheduler_methods_equal_the_schedulers(block_size, fn_name, module):
    for seed in range(4):
        ours, theirs = _scheduler_with_running(block_size, seed), _scheduler_with_running(block_size, seed)
        assert _state(ours) == _state(theirs) and ours.running
        for sched, fn in ((ours, getattr(Scheduler, fn_name)), (theirs, getattr(module, fn_name))):
            victim = sched.running.pop(seed % len(sched.running))
            if fn_name == "_free_request":
                victim.status = RequestStatus.FINISHED_STOPPED
            fn(sched, victim)
        assert _state(ours) == _state(theirs)


@pytest.mark.timeout(300)
def test_lab1_generate_loop_equals_llm_generate():
    """Lab 1's reference against LLM.generate's own loop (LLM._run_engine), in the real engine: the grader's
    reference observation is that loop's, so grading the exercise file compares the two (one shared helper)."""
    from minivllm.labs.grader import check_lab
    lines = []
    passed, total = check_lab(1, out=lines.append)
    assert passed == total, "\n".join(lines)


@pytest.mark.parametrize("vocab", [5, 50, 1000])
def test_lab9_rejection_sample_equals_the_rejection_samplers(vocab):
    """Mixed greedy and random rows (top-k on some): the same tokens from the same seeds, so the exercise draws its
    random numbers as the engine does; faults_spec.rejection with every switch off too."""
    from minivllm.sample.rejection_sampler import RejectionSampler
    from minivllm.sample.sampler import SamplingMetadata
    g = torch.Generator().manual_seed(vocab)
    for _ in range(20):
        n = int(torch.randint(1, 6, (1,), generator=g))
        drafts = [torch.randint(0, vocab, (int(torch.randint(0, 5, (1,), generator=g)),), generator=g).tolist()
                  for _ in range(n)]
        rows = sum(len(d) for d in drafts)
        logits = torch.randn(rows, vocab, generator=g) * 3
        for i, d in enumerate(drafts):  # some drafts are the argmax: greedy rows keep them
            start = sum(len(x) for x in drafts[:i])
            for j in range(len(d) // 2):
                d[j] = int(logits[start + j].argmax())
        temps = [float(t) for i, d in enumerate(drafts) for t in [(0.0, 0.8, 1.3)[i % 3]] * len(d)]
        top_k = torch.tensor([3 if t > 1 else 0 for t in temps], dtype=torch.int64)
        bonus = list(range(n))
        seed = int(torch.randint(0, 1 << 30, (1,), generator=g))

        def md():
            gens = [torch.Generator().manual_seed(seed + i) for i in range(n)]
            return SamplingMetadata(temperature=torch.tensor(temps), all_greedy=all(t == 0 for t in temps),
                                    top_k=top_k, top_p=None, min_p=None, max_num_logprobs=None,
                                    generators=[gens[i] for i, d in enumerate(drafts) for _ in d])
        ours = RejectionSampler()(drafts, logits, bonus, md())
        assert lab09_rejection_sampler.rejection_sample(None, drafts, logits, bonus, md()) == ours
        assert faults_spec.rejection(None, drafts, logits, bonus, md()) == ours


def test_lab10_propose_equals_the_ngram_proposers():
    from minivllm.spec_decode.ngram_proposer import NgramProposer
    rng = random.Random(10)
    for _ in range(400):
        tokens = np.array([rng.randrange(rng.choice((2, 3, 7))) for _ in range(rng.randrange(1, 70))])
        min_n = rng.randrange(1, 4)
        proposer = NgramProposer(rng.randrange(1, 9), min_n, rng.randrange(min_n, 7),
                                 len(tokens) + rng.randrange(-2, 9))
        ours = proposer.propose(tokens)
        assert lab10_ngram_proposer.propose(proposer, tokens) == ours == faults_spec.ngram(proposer, tokens)


@pytest.mark.parametrize("chunked", [True, False])
def test_lab11_num_new_tokens_equals_the_schedulers(chunked):
    rng = random.Random(int(chunked))
    for _ in range(300):
        max_model_len = rng.choice((24, 64, 8192))
        sched = Scheduler(SchedulerConfig(max_num_batched_tokens=8192, max_model_len=max_model_len,
                                          enable_chunked_prefill=chunked,
                                          long_prefill_token_threshold=rng.choice((0, 0, 3, 8))),
                          CacheConfig(block_size=rng.choice(BLOCK_SIZES), num_gpu_blocks=8))
        prompt = rng.randrange(1, min(max_model_len, 60))
        req = Request("r", list(range(prompt)), SamplingParams(max_tokens=None), 2)
        for t in range(rng.randrange(0, min(6, max_model_len - prompt))):
            req.append_output_token_ids(t)
        budget = rng.randrange(1, 40)
        if rng.random() < 0.5:  # running: some computed, drafts
            req.num_computed_tokens = rng.randrange(0, req.num_tokens)
            req.spec_token_ids = list(range(rng.randrange(0, 5)))
            args = (req, budget)
        else:  # being admitted after a hit
            args = (req, budget, rng.randrange(0, req.num_tokens))
        ours = Scheduler._num_new_tokens(sched, *args)
        assert lab11_token_budget._num_new_tokens(sched, *args) == ours == faults_spec.new_tokens(sched, *args), args


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_lab12_lookup_equals_the_managers(block_size):
    """Random holes in a filled cache: the exercise and faults_late.lookup give the manager's blocks and tokens."""
    from minivllm.core.kv_cache_manager import KVCacheManager
    from minivllm.labs import faults_late
    from minivllm.labs.exercises import lab12_prefix_lookup
    rng = random.Random(block_size)
    for _ in range(30):
        kvm, hasher = KVCacheManager(block_size, 32), kv_cache_utils.get_request_block_hasher(block_size)
        tokens = [rng.randrange(50) for _ in range(5 * block_size)]
        first = Request("a", tokens[:rng.randrange(1, 5 * block_size)], SamplingParams(max_tokens=1), 2,
                        block_hasher=hasher)
        kvm.allocate_slots(first, first.num_tokens)
        if rng.random() < 0.5:
            kvm.free(first)
        kvm.block_pool.evict_blocks([b for b in kvm.req_to_blocks.get("a", []) if rng.random() < 0.2])
        again = Request("b", tokens[:rng.randrange(1, 5 * block_size)],
                        SamplingParams(max_tokens=1, prompt_logprobs=rng.choice((None, None, 1))), 2,
                        block_hasher=hasher)
        ours = KVCacheManager.get_computed_blocks(kvm, again)
        assert lab12_prefix_lookup.get_computed_blocks(kvm, again) == ours == faults_late.lookup(kvm, again)


def test_lab13_stop_strings_equal_the_output_processors():
    from minivllm.engine.output_processor import OutputProcessor
    from minivllm.labs import faults_late
    from minivllm.labs.exercises import lab13_stop_strings
    rng = random.Random(13)
    for _ in range(400):
        text = "".join(rng.choice("ab. ") for _ in range(rng.randrange(0, 12)))
        new, keep = rng.randrange(0, len(text) + 1), rng.random() < 0.5
        stop = ["".join(rng.choice("ab. ") for _ in range(rng.randrange(1, 4))) for _ in range(rng.randrange(0, 3))]
        results = []
        for fn in (OutputProcessor._check_stop_strings, lab13_stop_strings._check_stop_strings, faults_late.stop_strings):
            state = SimpleNamespace(params=SamplingParams(stop=list(stop), include_stop_str_in_output=keep),
                                    detokenizer=SimpleNamespace(output_text=text))
            results.append((fn(state, text[len(text) - new:]), state.detokenizer.output_text))
        assert results[0] == results[1] == results[2], (text, new, stop, keep)


def test_lab14_row_parallel_equals_the_layers():
    """Every simulated rank (unit_tp's threads): the exercise's loader, bias and forward, and faults_late's helpers
    with every switch off, give the layer's own."""
    from minivllm.labs import faults_late, unit_tp
    from minivllm.labs.exercises import lab14_row_parallel as ex
    from minivllm.models.linear import RowParallelLinear as R
    for fns in ((ex.weight_loader, ex.local_bias, ex.forward), (faults_late.row_loader, R.local_bias,
                                                               faults_late.row_forward)):
        for names in (("weight_loader", "local_bias", "forward"),):
            ours, theirs = {}, {}
            sub = dict(zip(names, fns))
            for observe in (unit_tp.lab14_loader_observe, unit_tp.lab14_bias_observe, unit_tp.lab14_forward_observe):
                observe({"weight_loader": R.weight_loader, "local_bias": R.local_bias, "forward": R.forward}, None, ours)
                observe(sub, None, theirs)
            assert ours == theirs
