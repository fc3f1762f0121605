"""n > 1, penalties, logit_bias, allowed_token_ids, bad_words and prompt_logprobs, as vLLM defines them.

The sampler ops are checked against references written straight from the formulas on small
logits tensors; the engine-level tests run the tiny random Llama of conftest.py and compare
with plain forward passes of the HF model, outside the engine.
"""
from __future__ import annotations

import math

import pytest
import torch

from minivllm import LLM, SamplingParams
from minivllm.sample.sampler import PenaltyMetadata, Sampler, SamplingMetadata, apply_penalties

VOCAB = 49152  # the tiny models' vocabulary
PROMPT = "Once upon a time"


# ---------------------------------------------------------------- sampler ops against the formulas

def reference_penalties(logits, prompt, output, presence, frequency, repetition):
    """One row, token by token: vLLM's repetition penalty on prompt+output tokens, then OpenAI's two on outputs."""
    out = logits.clone()
    for t in range(out.shape[0]):
        if t in prompt or t in output:
            out[t] = out[t] / repetition if out[t] > 0 else out[t] * repetition
        count = output.count(t)
        out[t] -= frequency * count + presence * (1 if count else 0)
    return out


def padded(rows, vocab):
    width = max(1, max(len(r) for r in rows))
    return torch.tensor([r + [vocab] * (width - len(r)) for r in rows], dtype=torch.int64)


def metadata(n, **kw):
    base = dict(temperature=torch.zeros(n), all_greedy=True, top_k=None, top_p=None, min_p=None,
                generators=[torch.Generator().manual_seed(0)] * n, max_num_logprobs=None)
    return SamplingMetadata(**(base | kw))


def test_random_rows_draw_from_their_distribution_and_never_a_masked_token():
    """The inverse-CDF draw: 20,000 rows of one distribution land on each token as often as its probability
    (within 0.015), never on a token of probability 0 or outside top_k; a greedy row in the batch stays greedy."""
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0])
    n = 20_000
    logits = probs.clamp(min=1e-45).log().expand(n, -1).clone()
    logits[0] = torch.tensor([0.0, 9.0, 0.0, 0.0, 0.0])  # row 0 is greedy: token 1
    temperature = torch.ones(n)
    temperature[0] = 0
    md = metadata(n, temperature=temperature, all_greedy=False, generators=[torch.Generator().manual_seed(7)] * n)
    sampled = Sampler()(logits, md).sampled_token_ids
    assert sampled[0] == 1
    freq = torch.bincount(sampled[1:], minlength=5).float() / (n - 1)
    assert freq[1] == 0 and freq[4] == 0, freq
    torch.testing.assert_close(freq, probs, atol=0.015, rtol=0)
    top2 = Sampler()(logits[1:], metadata(n - 1, temperature=torch.ones(n - 1), all_greedy=False,
                                          top_k=torch.full((n - 1,), 2), generators=md.generators[1:]))
    assert set(top2.sampled_token_ids.tolist()) == {2, 3}  # token 0 (p 0.1) is outside the top 2


def test_penalties_match_the_formula():
    torch.manual_seed(0)
    vocab = 12
    logits = torch.randn(3, vocab) * 3
    prompts = [[1, 2, 2, 5], [0], [3, 4]]
    outputs = [[2, 7, 7, 7, 9], [], [4, 4, 11]]
    presence, frequency, repetition = [0.5, -1.0, 2.0], [0.3, 0.0, -0.7], [1.3, 0.8, 2.0]
    got = apply_penalties(logits, padded(prompts, vocab), padded(outputs, vocab), torch.tensor(presence),
                          torch.tensor(frequency), torch.tensor(repetition))
    for row in range(3):
        want = reference_penalties(logits[row], prompts[row], outputs[row], presence[row], frequency[row],
                                   repetition[row])
        torch.testing.assert_close(got[row], want)


def test_processing_order_and_raw_logprobs():
    """Whitelist, bad words, min_tokens, logit_bias, penalties, in that order; logprobs stay the raw ones."""
    torch.manual_seed(1)
    vocab = 10
    logits = torch.randn(3, vocab) * 2
    logits[0, 4] = 5.0  # row 0's favourite, outside its whitelist
    allowed = {0: [1, 2, 3], 2: list(range(vocab))}
    mask = torch.zeros(3, vocab, dtype=torch.bool)
    mask[0] = True
    mask[0, allowed[0]] = False
    # row 1: bad word [6, 8] (its prefix 6 ends the output) and bad word [3]; row 2: min_tokens masks 5
    bias = {0: {2: 1.5}, 2: {7: 4.0, 0: -2.0}}
    pen = PenaltyMetadata(rows=torch.tensor([0, 2]), presence_penalties=torch.tensor([0.0, 1.0]),
                          frequency_penalties=torch.tensor([0.0, 0.5]), repetition_penalties=torch.tensor([2.0, 1.5]),
                          prompt_token_ids=padded([[2], [7]], vocab), output_token_ids=padded([[], [7, 7]], vocab))
    md = metadata(3, max_num_logprobs=2, allowed_token_ids_mask=mask,
                  bad_words_token_ids={1: [[6, 8], [3]]}, output_token_ids=[[], [1, 6], []],
                  min_tokens_masks=[(2, [5])],
                  logit_bias=(torch.tensor([0, 2, 2]), torch.tensor([2, 7, 0]), torch.tensor([1.5, 4.0, -2.0])),
                  penalties=pen)
    assert not md.no_logits_processing and not md.no_penalties
    want = logits.clone()
    want[0, [t for t in range(vocab) if t not in allowed[0]]] = -math.inf
    want[1, 8] = want[1, 3] = -math.inf
    want[2, 5] = -math.inf
    for row, b in bias.items():
        for t, v in b.items():
            want[row, t] += v
    want[0] = reference_penalties(want[0], [2], [], 0.0, 0.0, 2.0)
    want[2] = reference_penalties(want[2], [7], [7, 7], 1.0, 0.5, 1.5)
    out = Sampler()(logits, md)
    assert out.sampled_token_ids.tolist() == want.argmax(dim=-1).tolist()
    raw = logits.log_softmax(dim=-1)
    torch.testing.assert_close(out.logprobs[0], raw.gather(1, out.sampled_token_ids[:, None]).squeeze(1))


def test_bad_words_block_only_a_completed_prefix():
    logits = torch.zeros(4, 6)
    words = [[2, 3, 4], [5]]
    outputs = [[], [1, 2], [2, 3], [0, 2, 3, 1]]
    md = metadata(4, bad_words_token_ids={r: words for r in range(4)}, output_token_ids=outputs)
    from minivllm.sample.sampler import apply_logits_processors
    blocked = [set(torch.nonzero(row.isinf()).flatten().tolist()) for row in apply_logits_processors(logits, md)]
    assert blocked == [{5}, {5}, {4, 5}, {5}]  # the one-token word always; 4 only right after 2, 3


def test_nothing_requested_means_nothing_done():
    md = metadata(2)
    assert md.no_logits_processing and md.no_penalties
    logits = torch.randn(2, 8)
    assert Sampler()(logits, md).sampled_token_ids.tolist() == logits.argmax(dim=-1).tolist()


# ---------------------------------------------------------------- engine level

@pytest.fixture(scope="module")
def llm(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=128, num_gpu_blocks_override=64)
    yield llm
    llm.shutdown()


@pytest.fixture(scope="module")
def hf_model(tiny_llama_folder):
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(tiny_llama_folder, dtype=torch.float32).eval()


def all_free(llm) -> bool:
    stats = llm.llm_engine.get_stats()
    return stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1 and stats["num_unfinished"] == 0


def gen(llm, prompts, params):
    return llm.generate(prompts, params, use_tqdm=False)


def test_n_seeded_samples_are_distinct_reproducible_and_one_output_per_prompt(llm):
    params = SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=6, ignore_eos=True)
    first = gen(llm, [PROMPT, "Hi there"], params)
    assert len(first) == 2 and all(o.finished for o in first)
    assert [o.prompt for o in first] == [PROMPT, "Hi there"]
    for out in first:
        assert [c.index for c in out.outputs] == [0, 1, 2]
        assert len({tuple(c.token_ids) for c in out.outputs}) == 3, "three seeds, three different samples"
    again = gen(llm, [PROMPT, "Hi there"], params)
    assert [[c.token_ids for c in o.outputs] for o in again] == [[c.token_ids for c in o.outputs] for o in first]
    # as vLLM's ParentRequest: child i samples with seed + i
    for i in range(3):
        alone = gen(llm, [PROMPT], SamplingParams(temperature=1.0, seed=7 + i, max_tokens=6, ignore_eos=True))
        assert alone[0].outputs[0].token_ids == first[0].outputs[i].token_ids
    assert all_free(llm)


def test_n_unseeded_and_mixed_with_n1_prompts(llm):
    params = [SamplingParams(n=2, temperature=1.0, max_tokens=4), SamplingParams(temperature=0, max_tokens=4),
              SamplingParams(n=4, temperature=0.9, top_k=50, max_tokens=3)]
    outs = gen(llm, ["a b c", "d e f", "g h i"], params)
    assert [len(o.outputs) for o in outs] == [2, 1, 4]
    assert [o.prompt for o in outs] == ["a b c", "d e f", "g h i"]
    assert [c.index for c in outs[2].outputs] == [0, 1, 2, 3]
    assert all(c.finished() for o in outs for c in o.outputs) and all_free(llm)


def test_n_with_greedy_is_refused_as_vllm():
    with pytest.raises(ValueError, match="SamplingParams.n must be 1 when using greedy"):
        SamplingParams(n=3, temperature=0)


def test_aborting_the_parent_aborts_every_child(llm):
    engine = llm.llm_engine
    engine.add_request("parent", PROMPT, SamplingParams(n=3, temperature=1.0, max_tokens=60, ignore_eos=True))
    engine.step()
    assert engine.get_stats()["num_unfinished"] == 3  # three children in EngineCore
    engine.abort_request(["parent"])
    assert not engine.has_unfinished_requests()
    while engine.get_stats()["num_unfinished"]:
        engine.step()
    assert all_free(llm) and not engine.output_processor.parent_requests


def test_allowed_token_ids_restrict_every_output_token(llm):
    allowed = [100, 200, 300, 2]
    for params in (SamplingParams(temperature=1.0, seed=0, max_tokens=12, allowed_token_ids=allowed),
                   SamplingParams(temperature=0, max_tokens=12, allowed_token_ids=allowed[:3])):
        out = gen(llm, [PROMPT], params)[0].outputs[0]
        assert out.token_ids and set(out.token_ids) <= set(params.allowed_token_ids), out.token_ids


def test_logit_bias_of_100_makes_greedy_pick_the_token(llm):
    free = gen(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True))[0].outputs[0]
    token = next(t for t in range(1000, 2000) if t not in free.token_ids)
    out = gen(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True,
                                            logit_bias={token: 100.0}))[0].outputs[0]
    assert out.token_ids == [token] * 5
    # logprobs stay those of the raw model distribution, as vLLM's default logprobs_mode
    biased = gen(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=1, logprobs=0,
                                               logit_bias={token: 100.0}))[0].outputs[0]
    assert biased.logprobs[0][token].rank > 1


def contains(seq, sub) -> bool:
    return any(seq[i:i + len(sub)] == sub for i in range(len(seq) - len(sub) + 1))


def test_bad_words_never_appear(llm):
    tokenizer = llm.get_tokenizer()
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    free = gen(llm, [PROMPT], params)[0].outputs[0]
    words = sorted({tokenizer.decode([t]).strip() for t in free.token_ids[:6]} - {""})
    assert words, free.token_ids
    _, request = llm.llm_engine.process_inputs("bw", PROMPT, SamplingParams(bad_words=words + ["hello world"]))
    sequences = request.sampling_params.bad_words_token_ids
    assert tokenizer.encode("hello world", add_special_tokens=False) in sequences
    assert tokenizer.encode(" hello world", add_special_tokens=False) in sequences  # the mid-text form too
    out = gen(llm, [PROMPT], SamplingParams(temperature=0, max_tokens=16, ignore_eos=True,
                                            bad_words=words))[0].outputs[0]
    assert out.token_ids != free.token_ids
    assert not any(contains(out.token_ids, s) for s in request.sampling_params.bad_words_token_ids[:2 * len(words)])
    for seeded in range(2):
        out = gen(llm, [PROMPT], SamplingParams(temperature=1.0, seed=seeded, max_tokens=16, ignore_eos=True,
                                                bad_words=words))[0].outputs[0]
        assert not any(contains(out.token_ids, s) for s in request.sampling_params.bad_words_token_ids)


def reference_penalized_greedy(model, prompt, steps, bias=None, presence=0.0, frequency=0.0, repetition=1.0):
    """Greedy decoding with full forward passes; logit_bias, then the penalties, applied from their formulas."""
    tokens = list(prompt)
    with torch.inference_mode():
        for _ in range(steps):
            logits = model(torch.tensor([tokens])).logits[0, -1].float()
            for t, b in (bias or {}).items():
                logits[t] += b
            logits = reference_penalties(logits, prompt, tokens[len(prompt):], presence, frequency, repetition)
            tokens.append(int(logits.argmax()))
    return tokens[len(prompt):]


# The random model never repeats itself greedily; a bias on token 1000 (raw logprob about -11) makes it
# come back every other step, which the penalties > 0 then hold back. Penalties < 1 or < 0 make it repeat.
BIAS = {1000: 6.0}


@pytest.mark.parametrize("bias,penalties", [
    (BIAS, dict(repetition_penalty=4.0)), (BIAS, dict(frequency_penalty=2.0)), (BIAS, dict(presence_penalty=2.0)),
    (None, dict(repetition_penalty=0.5)), (None, dict(presence_penalty=-2.0, repetition_penalty=1.2)),
    (None, dict(frequency_penalty=-1.5, presence_penalty=0.5))])
def test_penalties_change_greedy_output_as_the_reference(llm, hf_model, bias, penalties):
    ids = llm.get_tokenizer().encode(PROMPT)
    plain_params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias=bias)
    plain = gen(llm, [ids], plain_params)[0].outputs[0].token_ids
    # next to a plain request in the same batch: only the penalized row is processed
    both = gen(llm, [ids, ids], [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logit_bias=bias,
                                                **penalties), plain_params])
    got = both[0].outputs[0].token_ids
    assert both[1].outputs[0].token_ids == plain
    assert got != plain
    assert got == reference_penalized_greedy(hf_model, ids, 12, bias, penalties.get("presence_penalty", 0.0),
                                             penalties.get("frequency_penalty", 0.0),
                                             penalties.get("repetition_penalty", 1.0))


def test_the_sampler_skips_processing_when_no_request_asks(llm):
    runner = llm.llm_engine.engine_core.engine_core.model_executor.driver_worker.model_runner
    seen = []
    real = runner.sampler
    runner.sampler = lambda logits, md: (seen.append(md), real(logits, md))[1]
    try:
        gen(llm, [PROMPT], SamplingParams(temperature=0.5, seed=1, max_tokens=3))
        assert seen and all(md.no_logits_processing for md in seen)
        seen.clear()
        gen(llm, [PROMPT, "Hi"], [SamplingParams(temperature=0, max_tokens=3, repetition_penalty=1.5),
                                  SamplingParams(temperature=0, max_tokens=3)])
        assert all(md.penalties is not None and md.penalties.rows.numel() == 1 for md in seen)
        assert all(md.allowed_token_ids_mask is None and md.logit_bias is None for md in seen)
    finally:
        runner.sampler = real
    gen(llm, [PROMPT], SamplingParams(max_tokens=1))  # the next step hands the runner the finished ids
    state = runner.sampling_state
    assert not state.processing_reqs and not state.allowed_token_ids_masks and not runner.prompt_logprobs


def reference_prompt_logprobs(model, ids, k):
    with torch.inference_mode():
        logprobs = model(torch.tensor([ids])).logits[0].float().log_softmax(dim=-1)  # [len, vocab]
    return logprobs


def check_prompt_logprobs(out, logprobs, ids, k):
    assert out.prompt_logprobs is not None and len(out.prompt_logprobs) == len(ids)
    assert out.prompt_logprobs[0] is None
    for pos in range(1, len(ids)):
        entry, row = out.prompt_logprobs[pos], logprobs[pos - 1]
        token = ids[pos]
        assert math.isclose(entry[token].logprob, row[token].item(), abs_tol=1e-4)
        # ranks and the top k up to near-ties: the engine's model and HF's round differently
        value, tol = row[token].item(), 1e-4
        assert int((row > value + tol).sum()) + 1 <= entry[token].rank <= int((row > value - tol).sum()) + 1
        kth = row.topk(k).values[-1].item() if k else math.inf
        alternatives = [t for t in entry if t != token]
        assert len(alternatives) in (k - 1, k) and all(row[t].item() >= kth - tol for t in alternatives)
        assert all(math.isclose(entry[t].logprob, row[t].item(), abs_tol=tol) for t in entry)
        assert entry[token].decoded_token is not None


@pytest.mark.parametrize("engine_args", [{}, {"long_prefill_token_threshold": 5},
                                         {"max_num_batched_tokens": 7}])
def test_prompt_logprobs_match_a_reference_forward_pass(tiny_llama_folder, hf_model, engine_args):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=128, num_gpu_blocks_override=64,
              **engine_args)
    try:
        tokenizer = llm.get_tokenizer()
        prompts = ["In a paged KV cache, every request owns a list of physical blocks.", "Hi", PROMPT]
        ids = [tokenizer.encode(p) for p in prompts]
        params = [SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=3),
                  SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=0),
                  SamplingParams(temperature=0.8, n=2, max_tokens=3, prompt_logprobs=1)]
        outs = gen(llm, prompts, params)
        for out, prompt_ids, p in zip(outs, ids, params):
            check_prompt_logprobs(out, reference_prompt_logprobs(hf_model, prompt_ids, p.prompt_logprobs),
                                  prompt_ids, p.prompt_logprobs)
        plain = gen(llm, prompts[:1], SamplingParams(temperature=0, max_tokens=3))[0]
        assert plain.prompt_logprobs is None and plain.outputs[0].token_ids == outs[0].outputs[0].token_ids
        assert all_free(llm)
    finally:
        llm.shutdown()


def test_prompt_logprobs_survive_preemption_mid_prefill(tiny_llama_folder, hf_model):
    """A request preempted while its prompt is half done refills its chunks; the list goes out once."""
    with LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, num_gpu_blocks_override=6, block_size=8,
             max_num_batched_tokens=6) as llm:
        prompts = ["In a paged KV cache, every request owns a list of blocks", "The quick brown fox jumps",
                   "Once upon a time there was", "1, 2, 3, 4, 5, 6"]
        outs = gen(llm, prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, prompt_logprobs=2))
        assert llm.llm_engine.get_stats()["num_preemptions"] > 0
        for out, prompt in zip(outs, prompts):
            ids = llm.get_tokenizer().encode(prompt)
            check_prompt_logprobs(out, reference_prompt_logprobs(hf_model, ids, 2), ids, 2)


def test_prompt_logprobs_minus_one_is_the_whole_vocabulary(llm, tiny_llama_folder):
    ids = [1, 500, 600]
    with pytest.raises(ValueError, match="max_logprobs"):  # as vLLM: -1 counts as vocab_size against the cap
        gen(llm, [ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=-1))
    single = gen(llm, [[5]], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=2))[0]
    assert single.prompt_logprobs == [None]
    with LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=32, num_gpu_blocks_override=8,
             max_logprobs=-1) as unlimited:
        out = gen(unlimited, [ids], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=-1))[0]
    assert out.prompt_logprobs[0] is None and all(len(d) == VOCAB for d in out.prompt_logprobs[1:])
    for entry, token in zip(out.prompt_logprobs[1:], ids[1:]):  # the rank among the whole vocabulary
        assert entry[token].rank == sum(lp.logprob > entry[token].logprob for lp in entry.values()) + 1


@pytest.mark.parametrize("field,value", [
    ("n", 0), ("n", 1.0), ("n", True), ("presence_penalty", 2.5), ("presence_penalty", float("nan")),
    ("frequency_penalty", -2.01), ("frequency_penalty", "1"), ("repetition_penalty", 0),
    ("repetition_penalty", -1.0), ("repetition_penalty", float("inf")), ("repetition_penalty", True),
    ("prompt_logprobs", -2), ("prompt_logprobs", 1.0), ("prompt_logprobs", True),
    ("logit_bias", {"5": 1.0}), ("logit_bias", {5: float("nan")}), ("logit_bias", {True: 1.0}),
    ("logit_bias", {-1: 1.0}), ("logit_bias", [(5, 1.0)]),
    ("allowed_token_ids", []), ("allowed_token_ids", [-1]), ("allowed_token_ids", [1.0]),
    ("allowed_token_ids", "abc"), ("bad_words", [""]), ("bad_words", "word"), ("bad_words", [1]),
])
def test_bad_values_are_refused_naming_the_field(field, value):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        SamplingParams(temperature=1.0, **{field: value})


@pytest.mark.parametrize("kwargs,field", [
    (dict(logit_bias={VOCAB: 1.0}), "logit_bias"), (dict(allowed_token_ids=[1, VOCAB + 3]), "allowed_token_ids"),
    (dict(prompt_logprobs=VOCAB + 1), "prompt_logprobs"), (dict(n=2, seed=2**64 - 1), "seed"),
])
def test_vocabulary_checks_at_submission(llm, kwargs, field):
    with pytest.raises(ValueError, match=f"SamplingParams.{field}"):
        gen(llm, [PROMPT], SamplingParams(temperature=1.0, **kwargs))
    assert all_free(llm)


def test_defaults_are_vllms():
    p = SamplingParams()
    assert (p.n, p.presence_penalty, p.frequency_penalty, p.repetition_penalty) == (1, 0.0, 0.0, 1.0)
    assert (p.prompt_logprobs, p.logit_bias, p.allowed_token_ids, p.bad_words) == (None, None, None, [])
    assert SamplingParams(bad_words=["a", "b", "a"]).bad_words == ["a", "b"]  # duplicates dropped, as vLLM


def test_best_of_returns_the_n_most_likely_of_best_of_samples(tiny_llama_folder):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, num_gpu_blocks_override=64)
    prompt = "What is the meaning of life?"
    all5 = llm.generate([prompt], SamplingParams(n=5, temperature=0.8, max_tokens=6, seed=3, logprobs=0),
                        use_tqdm=False)[0].outputs
    best = llm.generate([prompt], SamplingParams(n=2, best_of=5, temperature=0.8, max_tokens=6, seed=3),
                        use_tqdm=False)[0].outputs
    ranked = sorted(all5, key=lambda c: c.cumulative_logprob, reverse=True)[:2]
    assert [c.token_ids for c in best] == [c.token_ids for c in ranked]  # same seeds: the same five samples
    assert [c.index for c in best] == [0, 1] and all(c.logprobs is None for c in best)  # none were asked for
    assert best[0].cumulative_logprob >= best[1].cumulative_logprob
    for bad in (dict(n=3, best_of=2), dict(best_of=2, temperature=0), dict(best_of=True)):
        with pytest.raises(ValueError, match="best_of|greedy"):
            SamplingParams(**bad)
    llm.shutdown()
