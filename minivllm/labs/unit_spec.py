"""Unit checks of lab 9 (the rejection sampler), without an engine: hand-made drafts and target logits.

Greedy cases give every row a known argmax (vocabularies of 10, 50, 101 and 1000 tokens, 1 to 7 drafts, batches
of 1 to 5 requests, some without drafts) and compare each request's tokens with the engine's RejectionSampler.
Random cases are statistical: 3000 seeded two-draft requests on a 5- and a 7-token vocabulary; the judge compares
the counts of each output position with the target's distribution p (the engine's Sampler.compute_probs, taken
from the reference run) by a chi-square test at a p-value of 1e-6: fixed seeds, so a given submission always gets
the same verdict. The generator check runs one batch twice, the second time in the reverse request order with
freshly seeded generators: every seeded request must get the same tokens.
"""
from __future__ import annotations

import torch

from minivllm.labs.errors import LabCheckFailed
from minivllm.labs.unit_checks import unit
from minivllm.sample.rejection_sampler import RejectionSampler
from minivllm.sample.sampler import Sampler, SamplingMetadata

P_VALUE = 1e-6  # a correct sampler fails one seeded case in a million; each fault in the labs fails by far more

# (label, vocab, drafts per request, each row's argmax, bonus tokens)
GREEDY = [("the docstring's example", 10, [[4, 9, 6], [2, 3], []], [4, 6, 1, 2, 3], [0, 8, 5]),
          ("first draft rejected, the later ones would match", 50, [[7, 7, 7]], [3, 7, 7], [11]),
          ("four requests, rejected at different drafts", 1000, [[5], [17, 18, 19, 20], [900, 901], [42, 43, 44]],
           [6, 17, 18, 3, 20, 900, 901, 42, 43, 44], [1, 2, 3, 4]),
          ("seven drafts, the last rejected", 101, [list(range(1, 8))], [1, 2, 3, 4, 5, 6, 100], [9])]
BONUS = [("one draft, kept", 10, [[3]], [3], [9]),
         ("four drafts, all kept", 50, [[8, 1, 8, 2]], [8, 1, 8, 2], [49]),
         ("requests without drafts between requests with drafts", 1000, [[], [10, 11], [], [12], []], [10, 11, 12],
          [1, 2, 3, 4, 5]),
         ("seven drafts, all kept", 101, [[5, 50, 100, 0, 7, 7, 7]], [5, 50, 100, 0, 7, 7, 7], [60])]
# (label, vocab, temperature, top_k, the two drafts, seed of the logits): 3000 requests of two drafts each
RANDOM = [("vocab 5, temperature 1", 5, 1.0, None, [1, 4], 1),  # (two tokens of vocab 7 fall outside its top-k)
          ("vocab 7, temperature 0.7, top-k 5", 7, 0.7, 5, [6, 3], 2)]
_N = 3000
_LISTS = "one list per request, in the requests' order, of Python ints (int(t) or t.item() of a tensor element)"


def _md(temperatures, generators, top_k=None) -> SamplingMetadata:
    t = torch.tensor(temperatures, dtype=torch.float32)
    return SamplingMetadata(temperature=t, all_greedy=bool((t == 0).all()), generators=generators,
                            top_k=None if top_k is None else torch.full((len(temperatures),), top_k),
                            top_p=None, min_p=None, max_num_logprobs=None)


def _plain(out, n: int):
    """The returned tokens, or a short description when they are not a list of n lists of Python ints."""
    if isinstance(out, list) and len(out) == n and all(isinstance(tokens, list) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in tokens) for tokens in out):
        return out
    bad = next((t for tokens in out for t in tokens if not isinstance(t, int)), None) if isinstance(out, list) and \
        all(isinstance(tokens, list) for tokens in out) else None
    return (f"an element of type {type(bad).__name__}: {repr(bad)[:40]}" if bad is not None else
            f"{type(out).__name__} {repr(out)[:70]}")


def _greedy_observe(cases):
    @unit
    def observe(sub, llm, obs):
        obs["cases"] = []
        for _, vocab, drafts, best, bonus in cases:
            logits = torch.randn(len(best), vocab, generator=torch.Generator().manual_seed(vocab))
            logits[range(len(best)), best] = logits.max() + 1.0
            out = sub["rejection_sample"](RejectionSampler(), [list(d) for d in drafts], logits, list(bonus),
                                          _md([0.0] * len(best), [torch.Generator()] * len(best)))
            obs["cases"].append(_plain(out, len(drafts)))
    return observe


def _greedy_hint(exp, got, drafts, bonus) -> str:
    if got == exp + [bonus]:
        return "the bonus token comes only when every draft was kept: a rejected draft's replacement is the last token"
    if len(got) > len(exp) and got[:len(exp)] == exp:
        return "the first rejected draft ends the request's tokens: no draft after it is judged or kept"
    if not drafts:
        return "a request without drafts gets its bonus token alone"
    if exp == drafts + [bonus] and got == drafts:
        return "every draft kept: the bonus token comes too (a request gains len(drafts) + 1 tokens)"
    return ("draft j of request i is judged by its own row: the rows of the requests before i (one per draft, none "
            "for a bonus token), then j")


def _greedy_judge(check: str, cases):
    def judge(obs, ref):
        for (label, vocab, drafts, best, bonus), exp, got in zip(cases, ref["cases"], obs["cases"]):
            if not isinstance(got, list):
                raise LabCheckFailed(check, f"{label}: return value", f"a list of {len(drafts)} lists of ints", got,
                                     _LISTS)
            row = 0
            for i, (d, e, g) in enumerate(zip(drafts, exp, got)):
                if e != g:
                    raise LabCheckFailed(check, f"{label} (vocab {vocab}): request {i}, drafts {d}, its rows' "
                                         f"argmax {best[row:row + len(d)]}, bonus {bonus[i]}", e, g,
                                         _greedy_hint(e, g, d, bonus[i]))
                row += len(d)
    return judge


lab9_greedy_observe, lab9_greedy_judge = _greedy_observe(GREEDY), _greedy_judge(
    "greedy: kept prefix, then the target token", GREEDY)
lab9_bonus_observe, lab9_bonus_judge = _greedy_observe(BONUS), _greedy_judge(
    "greedy: the bonus after every kept draft", BONUS)


@unit
def lab9_random_observe(sub, llm, obs):
    """Per case: the counts of the first token, of the second among requests that kept draft 0, of the lengths."""
    obs["cases"] = []
    for _, vocab, temperature, top_k, (d0, d1), seed in RANDOM:
        logits = torch.randn(2, vocab, generator=torch.Generator().manual_seed(seed)) * 1.5
        rows, generator = logits.repeat(_N, 1), torch.Generator().manual_seed(seed)
        md = _md([temperature] * (2 * _N), [generator] * (2 * _N), top_k)
        p = Sampler.compute_probs(logits, _md([temperature] * 2, [generator] * 2, top_k))
        out = _plain(sub["rejection_sample"](RejectionSampler(), [[d0, d1] for _ in range(_N)], rows, [0] * _N, md), _N)
        case = {"p": p.tolist(), "repr": out if isinstance(out, str) else None}
        if not isinstance(out, str):
            case["first"] = [sum(1 for o in out if o and o[0] == x) for x in range(vocab)]
            case["second"] = [sum(1 for o in out if len(o) > 1 and o[0] == d0 and o[1] == x) for x in range(vocab)]
            case["lengths"] = [sum(1 for o in out if len(o) == n) for n in (1, 2, 3)]
        obs["cases"].append(case)


def _p_value(counts, probs) -> float:
    """Chi-square goodness of fit of counts to probs (0 when a count falls on a probability-0 outcome)."""
    n = sum(counts)
    if n == 0 or any(c and not p for c, p in zip(counts, probs)):
        return 0.0
    cells = [(c, n * p) for c, p in zip(counts, probs) if p > 0]
    chi2 = sum((c - e) ** 2 / e for c, e in cells)
    return 1.0 if len(cells) < 2 else float(torch.special.gammaincc(torch.tensor((len(cells) - 1) / 2),
                                                                    torch.tensor(chi2 / 2)))


def _expected(p0, p1, d0, d1) -> dict:
    """What each observed count should follow, given the target's two rows."""
    keep0, keep1 = p0[d0], p1[d1]
    return {"first": p0, "second": p1, "lengths": [1 - keep0, keep0 * (1 - keep1), keep0 * keep1]}


def _random_hint(p, d) -> dict:
    """The distribution of the first token under the usual mistakes -> the hint for each."""
    from_p = [(1 - p[d]) * x + (p[d] if i == d else 0.0) for i, x in enumerate(p)]
    best = max(range(len(p)), key=p.__getitem__)
    return {"resampled from p": (from_p, "a rejected draft is replaced by a draw from the residual: p with the "
                                 "draft's probability set to 0, renormalised; a draw from p itself returns the "
                                 "draft too often"),
            "argmax": ([float(i == best) for i in range(len(p))], "a random row (temperature > 0) keeps its draft "
                       "with probability p(draft) and draws its replacement: the argmax is for greedy rows only")}


def lab9_random_judge(obs, ref):
    check = "random: the target distribution"
    for (label, vocab, _, _, (d0, d1), _), exp, got in zip(RANDOM, ref["cases"], obs["cases"]):
        p0, p1 = exp["p"]
        expected = _expected(p0, p1, d0, d1)
        if got.get("repr") is not None:
            raise LabCheckFailed(check, f"{label}: return value", f"a list of {_N} lists of ints", got["repr"],
                                 _LISTS)
        for key, what in (("first", "output token 0"), ("second", "output token 1 of the requests that kept "
                                                                  f"draft 0 ({d0})"), ("lengths", "1, 2, 3 tokens")):
            if _p_value(exp[key], expected[key]) < P_VALUE:
                raise RuntimeError(f"lab 9's reference fails its own chi-square ({label}, {key}): fix the grader")
            if (pv := _p_value(got[key], expected[key])) < P_VALUE:
                hint = ("keep draft j with probability p_j(draft) (u < p_j[draft], u from the row's generator); "
                        "on a rejection draw from p_j without the draft; p is Sampler.compute_probs(logits, md): "
                        "temperature and top-k included")
                if key == "first":
                    fits = [(_p_value(got[key], q), h) for q, h in _random_hint(p0, d0).values()]
                    hint = max(fits)[1] if max(fits)[0] >= P_VALUE else hint
                n = sum(got[key])
                raise LabCheckFailed(check, f"{label}, {_N} requests with drafts [{d0}, {d1}]: counts of {what}",
                                     f"close to {[round(n * q) for q in expected[key]]} (p of each)",
                                     f"{got[key]} (chi-square p-value {pv:.1e})", hint)


def _batch(sub, order, vocab: int = 6):
    """40 requests of 3 drafts (every fifth greedy), run in `order` with generators seeded per request."""
    g = torch.Generator().manual_seed(40)
    logits = torch.randn(40, 3, vocab, generator=g)
    drafts = torch.randint(0, vocab, (40, 3), generator=g).tolist()
    temps = [0.0 if i % 5 == 0 else 1.0 for i in range(40)]
    gens = {i: torch.Generator().manual_seed(1000 + i) for i in order}
    md = _md([temps[i] for i in order for _ in range(3)], [gens[i] for i in order for _ in range(3)])
    out = _plain(sub["rejection_sample"](RejectionSampler(), [drafts[i] for i in order],
                                         torch.cat([logits[i] for i in order]), [100 + i for i in order], md), 40)
    return out if isinstance(out, str) else [out[order.index(i)] for i in range(40)]


@unit
def lab9_generator_observe(sub, llm, obs):
    obs["forward"] = _batch(sub, list(range(40)))
    obs["backward"] = _batch(sub, list(range(39, -1, -1)))


def lab9_generator_judge(obs, ref):
    check = "random: every request on its own generator"
    for i in range(40):
        for key in ("forward", "backward"):
            if not isinstance(obs[key], list):
                raise LabCheckFailed(check, f"{key} batch: return value", "a list of 40 lists of ints", obs[key],
                                     _LISTS)
        if i % 5 == 0 and obs["forward"][i] != ref["forward"][i]:
            raise LabCheckFailed(check, f"request {i} (greedy, in a batch of random requests)", ref["forward"][i],
                                 obs["forward"][i], "a row with temperature 0 is greedy whatever the other rows")
        if obs["forward"][i] != obs["backward"][i]:
            raise LabCheckFailed(check, f"request {i} (seeded), in a batch of 40 then in the reverse order",
                                 obs["forward"][i], obs["backward"][i], "a seeded request's random numbers come from "
                                 "md.generators[r] of its own rows: with the same seed it gets the same tokens "
                                 "whatever else shares the batch and in whatever order")
