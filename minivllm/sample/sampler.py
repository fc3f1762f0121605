"""Mirror of vllm/v1/sample/sampler.py: logits [num_logits, vocab_size] -> one token id per row.

In vLLM's order: logprobs are taken from the raw model distribution first
(vLLM's default logprobs_mode). Then the logits are processed: the
allowed_token_ids whitelist, bad words, min_tokens (EOS and stop ids masked),
logit_bias, then the penalties (repetition, frequency, presence). Greedy rows
take the argmax of those processed logits. Random rows go on with temperature,
min-p, top-k and top-p, then draw one token per row by inverse CDF: one
uniform number from the request's own generator, looked up in the row's
cumulative probabilities, so a seeded request samples the same tokens whatever
else shares the batch. Every processing step is skipped when no row of the
batch uses it. Left out: custom logits processors, logprobs_mode other than
raw_logprobs.

Where we differ from vLLM: vLLM draws with the exponential race (argmax of
probs / Exp(1) noise, one exponential number per vocabulary entry). Both draw
exactly from the row's distribution; on the CPU one exponential number per
vocabulary entry costs far more than a cumulative sum and one lookup, so
minivllm draws by inverse CDF. A seeded request's tokens are therefore
reproducible here, not equal to vLLM's.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class SamplingMetadata:
    temperature: torch.Tensor  # [num_logits] float; rows with 0 are greedy
    all_greedy: bool
    top_k: torch.Tensor | None  # [num_logits] int, 0 = off; None if no row uses it
    top_p: torch.Tensor | None  # [num_logits] float, 1 = off
    min_p: torch.Tensor | None  # [num_logits] float, 0 = off
    generators: list[torch.Generator]  # one per row: the request's own, or the engine's
    max_num_logprobs: int | None  # None: no row asked for logprobs
    # (row, token ids) for rows still short of min_tokens: those ids (EOS, stop ids) get logit -inf
    min_tokens_masks: list[tuple[int, list[int]]] = field(default_factory=list)
    # The rest is None / empty unless some row of the batch uses it (then the sampler skips it).
    allowed_token_ids_mask: torch.Tensor | None = None  # [num_logits, vocab_size] bool, True = not allowed
    # row -> token sequences of its bad words; output_token_ids[row] holds what that row sampled so far
    bad_words_token_ids: dict[int, list[list[int]]] = field(default_factory=dict)
    output_token_ids: list[list[int]] = field(default_factory=list)
    logit_bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # (rows, token ids, biases)
    penalties: "PenaltyMetadata | None" = None

    @property
    def no_penalties(self) -> bool:
        return self.penalties is None

    @property
    def no_logits_processing(self) -> bool:
        return (not self.min_tokens_masks and self.allowed_token_ids_mask is None and not self.bad_words_token_ids
                and self.logit_bias is None and self.penalties is None)


@dataclass
class PenaltyMetadata:
    """The rows with a penalty, each with its three penalties and its prompt and output ids.

    Token id tensors are right-padded with vocab_size, an id that counts nowhere.
    """

    rows: torch.Tensor  # [num_penalized] int64: rows of the logits
    presence_penalties: torch.Tensor  # [num_penalized] float
    frequency_penalties: torch.Tensor  # [num_penalized] float
    repetition_penalties: torch.Tensor  # [num_penalized] float
    prompt_token_ids: torch.Tensor  # [num_penalized, max_prompt_len] int64
    output_token_ids: torch.Tensor  # [num_penalized, max_output_len] int64


@dataclass
class SamplerOutput:
    sampled_token_ids: torch.Tensor  # [num_logits]
    # (logprob of sampled, rank of sampled, top-k ids, top-k logprobs) when asked for
    logprobs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor] | None


class Sampler:
    def __call__(self, logits: torch.Tensor, md: SamplingMetadata) -> SamplerOutput:
        raw = logits = logits.float()
        if not md.no_logits_processing:
            logits = apply_logits_processors(logits, md)
        greedy = self.greedy_sample(logits)  # [num_logits]
        sampled = greedy if md.all_greedy else self._sample(logits, md, greedy)
        # as vLLM's default logprobs_mode: logprobs of the raw model distribution, before any masking
        return SamplerOutput(sampled, self._logprobs(raw, sampled, md.max_num_logprobs))

    @staticmethod
    def greedy_sample(logits: torch.Tensor) -> torch.Tensor:
        """Each row's argmax: the first of tied maxima (vLLM's greedy_sample)."""
        return logits.argmax(dim=-1).view(-1)

    def _sample(self, logits: torch.Tensor, md: SamplingMetadata, greedy: torch.Tensor) -> torch.Tensor:
        random = self.draw(self.compute_probs(logits, md), md.generators)
        return torch.where(md.temperature == 0, greedy, random)

    @staticmethod
    def compute_probs(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
        """The distribution random rows draw from: temperature, min-p, top-k, top-p (greedy rows at temperature 1,
        unused). The rejection sampler verifies drafts against the same probabilities."""
        temperature = torch.where(md.temperature == 0, torch.ones_like(md.temperature), md.temperature)
        logits = logits / temperature.unsqueeze(1)
        if md.min_p is not None:  # drop tokens below min_p x the top probability
            probs = logits.softmax(dim=-1)
            threshold = md.min_p.unsqueeze(1) * probs.max(dim=-1, keepdim=True).values
            logits = logits.masked_fill(probs < threshold, float("-inf"))
        if md.top_k is not None or md.top_p is not None:
            logits = apply_top_k_top_p(logits, md.top_k, md.top_p)
        return logits.softmax(dim=-1)  # [num_logits, vocab_size]

    @staticmethod
    def draw(probs: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """One token per row by inverse CDF: one uniform number from the row's generator, looked up in the row's
        cumulative (not necessarily normalised) probabilities."""
        cdf = probs.cumsum(dim=-1)  # [rows, vocab_size]; masked tokens add nothing
        u = torch.cat([torch.rand(1, generator=g, device=cdf.device) for g in generators])  # [rows]
        # the first token whose cumulative mass exceeds u x the row's total (clamped: rounding at the very end)
        token = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True).squeeze(1)
        return token.clamp_(max=cdf.shape[1] - 1)

    @staticmethod
    def _logprobs(logits: torch.Tensor, sampled: torch.Tensor, k: int | None):
        if k is None:
            return None
        logprobs = logits.log_softmax(dim=-1)
        sampled_lp = logprobs.gather(1, sampled.unsqueeze(1)).squeeze(1)
        rank = (logprobs > sampled_lp.unsqueeze(1)).sum(dim=-1) + 1
        top_lp, top_ids = logprobs.topk(k, dim=-1) if k > 0 else (logprobs[:, :0], sampled[:, None][:, :0])
        return sampled_lp, rank, top_ids, top_lp


def apply_logits_processors(logits: torch.Tensor, md: SamplingMetadata) -> torch.Tensor:
    """A processed copy of logits, in vLLM's order: whitelist, bad words, min_tokens, logit_bias, penalties."""
    logits = logits.clone()
    if md.allowed_token_ids_mask is not None:
        logits.masked_fill_(md.allowed_token_ids_mask, float("-inf"))
    if md.bad_words_token_ids:
        apply_bad_words_(logits, md.bad_words_token_ids, md.output_token_ids)
    if md.min_tokens_masks:
        apply_min_tokens_(logits, md.min_tokens_masks)
    if md.logit_bias is not None:
        rows, cols, biases = md.logit_bias
        logits[rows, cols] += biases
    if md.penalties is not None:
        pm = md.penalties
        logits[pm.rows] = apply_penalties(logits[pm.rows], pm.prompt_token_ids, pm.output_token_ids,
                                          pm.presence_penalties, pm.frequency_penalties, pm.repetition_penalties)
    return logits


def apply_min_tokens_(logits: torch.Tensor, masks: list[tuple[int, list[int]]]) -> torch.Tensor:
    """Each listed row's stop ids at -inf, in place (vLLM's MinTokensLogitsProcessor)."""
    rows = torch.tensor([row for row, ids in masks for _ in ids], dtype=torch.int64, device=logits.device)
    cols = torch.tensor([t for _, ids in masks for t in ids], dtype=torch.int64, device=logits.device)
    logits[rows, cols] = float("-inf")
    return logits


def apply_bad_words_(logits: torch.Tensor, bad_words: dict[int, list[list[int]]],
                     output_token_ids: list[list[int]]) -> torch.Tensor:
    """In place: -inf on the last token of each bad word whose other tokens end the row's output so far.

    A one-token bad word is always masked; a longer one only right after its prefix was sampled
    (vLLM's apply_bad_words looks at output tokens only, not the prompt).
    """
    for row, sequences in bad_words.items():
        past = output_token_ids[row]
        for sequence in sequences:
            prefix_len = len(sequence) - 1
            if prefix_len > len(past):
                continue
            if prefix_len == 0 or past[len(past) - prefix_len:] == sequence[:-1]:
                logits[row, sequence[-1]] = float("-inf")
    return logits


def token_bin_counts(token_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """[rows, len] ids padded with vocab_size -> [rows, vocab_size] occurrence counts."""
    counts = torch.zeros(token_ids.shape[0], vocab_size + 1, dtype=torch.int64, device=token_ids.device)
    counts.scatter_add_(1, token_ids, torch.ones_like(token_ids))
    return counts[:, :vocab_size]


def apply_penalties(logits: torch.Tensor, prompt_token_ids: torch.Tensor, output_token_ids: torch.Tensor,
                    presence: torch.Tensor, frequency: torch.Tensor, repetition: torch.Tensor) -> torch.Tensor:
    """vLLM's three penalties on logits [rows, vocab_size]; returns a new tensor.

    repetition (tokens in the prompt or the output): a positive logit is divided by it, a negative
    one multiplied. Then, as the OpenAI API defines them, on output tokens only:
    logit -= frequency * count + presence * (count > 0).
    """
    vocab_size = logits.shape[1]
    output_counts = token_bin_counts(output_token_ids, vocab_size)  # [rows, vocab_size]
    output_mask = output_counts > 0
    seen = output_mask | (token_bin_counts(prompt_token_ids, vocab_size) > 0)
    penalty = torch.where(seen, repetition.unsqueeze(1), torch.ones_like(logits))
    logits = torch.where(logits > 0, logits / penalty, logits * penalty)
    logits = logits - frequency.unsqueeze(1) * output_counts
    return logits - presence.unsqueeze(1) * output_mask


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Mask to -inf every token outside the top k and outside the smallest set with mass >= top_p."""
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # [num_logits, vocab_size]
    vocab = logits.shape[1]
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).clamp(max=vocab)
        kth = sorted_logits.gather(1, (k - 1).unsqueeze(1))
        sorted_logits = sorted_logits.masked_fill(sorted_logits < kth, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs  # mass of strictly better tokens
        sorted_logits = sorted_logits.masked_fill(mass_before >= top_p.unsqueeze(1), float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
