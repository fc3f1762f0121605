"""Mirror of vllm/sampling_params.py: the per-request knobs of generation.

SamplingParams validates itself on construction, so a bad value fails where the
user typed it, with the name of the field to change. Types are strict as in
vLLM's msgspec struct: a bool is not an int, a string is not a bool, NaN is no
number, and a float must survive float32 (the sampler's dtype: 1e39 overflows, 1e-50
underflows to 0). As vLLM, a temperature in (0, 0.01) is raised to 0.01 with a warning.
Left out: beam search, guided decoding, custom logits processors, output_kind
(the engine always reports cumulative outputs), detokenize=False.

The fields that reach the sampler (penalties, logit_bias, allowed_token_ids, bad_words)
act in vLLM's order, see minivllm/sample/sampler.py; `n` is fanned out into n child
requests by the caller-side engine (minivllm/engine/parallel_sampling.py).
"""
from __future__ import annotations

import copy
import math
import logging
import struct
from dataclasses import dataclass, field

from minivllm.utils.math_utils import is_int, is_number  # noqa: F401  (is_int: also the engine's check)

logger = logging.getLogger("minivllm")
SEED_RANGE = (-(2**63), 2**64 - 1)  # what torch.Generator.manual_seed accepts
_MAX_TEMP = 1e-2  # vLLM's name: a temperature in (0, 0.01) is raised to this (logits / 1e-40 overflow float32)


def fits_float32(value) -> bool:
    """A finite number that float32 (the sampler's dtype) holds: no overflow to inf, no underflow of a non-zero to 0."""
    if not is_number(value):
        return False
    try:
        as_float32 = struct.unpack("f", struct.pack("f", value))[0]
    except OverflowError:  # past float32's largest finite value
        return False
    return math.isfinite(as_float32) and (value == 0 or as_float32 != 0)


@dataclass
class SamplingParams:
    n: int = 1  # samples per prompt: one RequestOutput with n CompletionOutputs (refused with greedy, as vLLM)
    # sample this many (>= n) and return the n with the highest cumulative logprob: vLLM V0's meaning, which
    # its llm_engine_example still uses (V1 refuses best_of > 1; minivllm keeps it, on top of the n fan-out)
    best_of: int | None = None
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted from the logit of every token already in the output
    frequency_penalty: float = 0.0  # in [-2, 2]: subtracted once per occurrence of the token in the output
    repetition_penalty: float = 1.0  # > 0: tokens seen in prompt or output get logit / p (if > 0) or * p
    temperature: float = 1.0  # 0 means greedy; in (0, 0.01) raised to 0.01 with a warning, as vLLM
    top_p: float = 1.0
    top_k: int = 0  # 0 (or -1) means the whole vocabulary; above the vocabulary size, the same
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = 16  # None: up to max_model_len
    min_tokens: int = 0  # EOS and stop_token_ids are masked, stop strings unchecked, until this many exist
    stop: list[str] | str | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None  # also return this many top alternatives; -1: the whole vocabulary
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False  # keep the stop string (or stop token's text) in `text`
    prompt_logprobs: int | None = None  # per prompt token, this many top alternatives too; -1: the whole vocabulary
    logit_bias: dict[int, float] | None = None  # token id -> added to its logit (not clamped, as vLLM's own class)
    allowed_token_ids: list[int] | None = None  # if set, every other token's logit is -inf
    bad_words: list[str] | None = None  # words never completed: the last token of each is masked after its prefix
    # the token ids of each bad word (plain and with a leading space), set at submission by update_from_tokenizer
    _bad_words_token_ids: list[list[int]] | None = field(default=None, repr=False)
    # EOS (unless ignore_eos) plus stop_token_ids: set at submission, what min_tokens masks
    _all_stop_token_ids: set[int] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop) if isinstance(self.stop, (list, tuple)) else self.stop or []
        if isinstance(self.stop_token_ids, (list, tuple)) or self.stop_token_ids is None:
            self.stop_token_ids = list(self.stop_token_ids or [])
        if isinstance(self.bad_words, (list, tuple)) or self.bad_words is None:
            self.bad_words = list(dict.fromkeys(self.bad_words or []))  # as vLLM: duplicates dropped, order kept
        if isinstance(self.allowed_token_ids, tuple):
            self.allowed_token_ids = list(self.allowed_token_ids)
        if is_number(self.temperature) and 0 < self.temperature < _MAX_TEMP:  # as vLLM, with its warning
            logger.warning("temperature %s is less than %s, which may cause numerical errors nan or inf in tensors. "
                           "We have maxed it out to %s.", self.temperature, _MAX_TEMP, _MAX_TEMP)
            self.temperature = _MAX_TEMP
        self._verify()
        if self.top_k == -1:
            self.top_k = 0
        self._all_stop_token_ids = set(self.stop_token_ids)

    def _verify(self) -> None:
        def bad(name: str, want: str) -> None:
            got = repr(getattr(self, name))
            got = got if len(got) <= 80 else got[:77] + "..."  # one short line, however long the value
            raise ValueError(f"SamplingParams.{name} must be {want}, got {got}.")

        if not is_int(self.n) or self.n < 1:
            bad("n", "an int >= 1")
        if self.best_of is not None and (not is_int(self.best_of) or self.best_of < self.n):
            bad("best_of", f"an int >= n ({self.n}) or None")
        for name in ("presence_penalty", "frequency_penalty"):
            if not is_number(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                bad(name, "a number in [-2, 2]")
        if not fits_float32(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad("repetition_penalty", "a number > 0 that float32 holds (1 disables it)")
        if not fits_float32(self.temperature) or self.temperature < 0:
            bad("temperature", "a number >= 0 that float32 holds (0 means greedy)")
        if not fits_float32(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "a number in (0, 1] that float32 holds (not below 1.4e-45)")
        if not is_int(self.top_k) or self.top_k < -1:
            bad("top_k", "an int >= 0 (0 or -1 disables it)")
        if not fits_float32(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "a number in [0, 1] that float32 holds")
        if self.seed is not None and not (is_int(self.seed) and SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            bad("seed", "an int in [-2**63, 2**64 - 1] or None")
        if self.max_tokens is not None and (not is_int(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", "an int >= 1 or None")
        if not is_int(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "an int >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"<= max_tokens ({self.max_tokens})")
        if not isinstance(self.stop, list) or not all(isinstance(s, str) and s for s in self.stop):
            bad("stop", "a string or a list of non-empty strings")
        if not isinstance(self.stop_token_ids, list) or not all(is_int(t) and t >= 0 for t in self.stop_token_ids):
            bad("stop_token_ids", "a list of token ids (ints >= 0)")
        if self.logprobs is not None and (not is_int(self.logprobs) or self.logprobs < -1):
            bad("logprobs", "an int >= 0, -1 for the whole vocabulary, or None")
        if self.prompt_logprobs is not None and (not is_int(self.prompt_logprobs) or self.prompt_logprobs < -1):
            bad("prompt_logprobs", "an int >= 0, -1 for the whole vocabulary, or None")
        if self.logit_bias is not None and not (
                isinstance(self.logit_bias, dict)
                and all(is_int(t) and t >= 0 and fits_float32(b) for t, b in self.logit_bias.items())):
            bad_ids = [t for t, b in self.logit_bias.items() if not (is_int(t) and t >= 0 and fits_float32(b))] \
                if isinstance(self.logit_bias, dict) else []
            raise ValueError(f"SamplingParams.logit_bias must be a dict {{token id (int >= 0): bias (a number float32 "
                             f"holds)}} or None; {len(bad_ids)} entries are not, the first: {repr(bad_ids[:1])[:40]}.")
        if self.allowed_token_ids is not None and not (
                isinstance(self.allowed_token_ids, list) and self.allowed_token_ids
                and all(is_int(t) and t >= 0 for t in self.allowed_token_ids)):
            bad("allowed_token_ids", "a non-empty list of token ids (ints >= 0) or None")
        if not isinstance(self.bad_words, list) or not all(isinstance(w, str) and w.strip() for w in self.bad_words):
            bad("bad_words", "a list of non-empty strings or None")
        for name in ("ignore_eos", "skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                bad(name, "True or False")
        if self.num_samples > 1 and self.greedy:  # as vLLM's _verify_greedy_sampling: n greedy samples would all be one
            raise ValueError(f"SamplingParams.n must be 1 when using greedy sampling (temperature=0), got {self.n}: "
                             f"set temperature > 0 for n different samples.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def num_samples(self) -> int:
        """How many sequences are sampled: best_of if set, else n."""
        return self.best_of or self.n

    @property
    def all_stop_token_ids(self) -> set[int]:
        return self._all_stop_token_ids

    def clone(self) -> "SamplingParams":
        return copy.deepcopy(self)

    @property
    def bad_words_token_ids(self) -> list[list[int]] | None:
        return self._bad_words_token_ids

    @property
    def uses_logits_processing(self) -> bool:
        """Whether the sampler has anything to do for this request beyond temperature/top-k/top-p/min-p."""
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0
                    or self.logit_bias or self.allowed_token_ids is not None or self._bad_words_token_ids)

    def update_from_generation_config(self, eos_token_id: int | None) -> None:
        """At submission (on the engine's own copy): EOS joins the ids that min_tokens holds back."""
        if eos_token_id is not None and not self.ignore_eos:
            self._all_stop_token_ids.add(eos_token_id)

    def update_from_tokenizer(self, tokenizer, vocab_size: int | None = None) -> None:
        """At submission: tokenize each bad word as vLLM does, alone and after a space.

        The form after a space (a word in mid-text) is kept only if it is a different token
        sequence of the same length as the plain form, as vLLM's rule. Ids past the model's
        vocabulary are refused.
        """
        if not self.bad_words:
            return
        sequences: list[list[int]] = []
        for word in self.bad_words:
            plain = tokenizer.encode(word.lstrip(), add_special_tokens=False)
            if not plain:
                raise ValueError(f"SamplingParams.bad_words: {word!r} tokenizes to no token at all.")
            sequences.append(list(plain))
            spaced = tokenizer.encode(" " + word.lstrip(), add_special_tokens=False)
            if spaced and spaced[0] != plain[0] and len(spaced) == len(plain):
                sequences.append(list(spaced))
        limit = vocab_size if vocab_size is not None else len(tokenizer)
        outside = sorted({t for ids in sequences for t in ids if not 0 <= t < limit})
        if outside:
            raise ValueError(f"SamplingParams.bad_words tokenize to ids {outside} outside the vocabulary [0, {limit}).")
        self._bad_words_token_ids = sequences
