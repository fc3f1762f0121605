"""The model runner's per-request sampling state, and the SamplingMetadata it builds for each step.

vLLM keeps these columns in its InputBatch (`_make_sampling_metadata`); here they live beside it, keyed
by request id, because a preempted request loses its InputBatch row but keeps its sampling state (its
seeded generator, its whitelist) for the recompute. Work for penalties, logit_bias, allowed_token_ids
and bad_words is done only for the rows whose requests ask for them.
"""
from __future__ import annotations

import numpy as np
import torch

from minivllm.sample.sampler import PenaltyMetadata, SamplingMetadata
from minivllm.sampling_params import SamplingParams
from minivllm.worker.input_batch import InputBatch


class SamplingState:
    def __init__(self, vocab_size: int, device: torch.device, seed: int) -> None:
        self.vocab_size, self.device = vocab_size, device
        self.requests: dict[str, SamplingParams] = {}  # live requests, preempted ones included
        self.num_prompt_tokens: dict[str, int] = {}  # so the runner knows how many outputs a request has
        self.generators: dict[str, torch.Generator] = {}  # seeded requests; the rest share `generator`
        self.generator = torch.Generator(device=device).manual_seed(seed)
        # requests whose logits need processing (penalties, bias, whitelist, bad words): the rest skip it
        self.processing_reqs: set[str] = set()
        self.allowed_token_ids_masks: dict[str, torch.Tensor] = {}  # req_id -> [vocab_size] bool, True = masked

    def add_request(self, req_id: str, params: SamplingParams, num_prompt_tokens: int) -> None:
        self.requests[req_id] = params
        self.num_prompt_tokens[req_id] = num_prompt_tokens
        if params.seed is not None:
            self.generators[req_id] = torch.Generator(device=self.device).manual_seed(params.seed)
        if params.uses_logits_processing:
            self.processing_reqs.add(req_id)
            if params.allowed_token_ids is not None:
                mask = torch.ones(self.vocab_size, dtype=torch.bool, device=self.device)
                mask[torch.tensor(params.allowed_token_ids, dtype=torch.int64, device=self.device)] = False
                self.allowed_token_ids_masks[req_id] = mask

    def remove_request(self, req_id: str) -> None:
        self.requests.pop(req_id, None)
        self.num_prompt_tokens.pop(req_id, None)
        self.generators.pop(req_id, None)
        self.processing_reqs.discard(req_id)
        self.allowed_token_ids_masks.pop(req_id, None)

    def make_sampling_metadata(self, req_ids: list[str], batch: InputBatch) -> SamplingMetadata:
        """The sampler's per-row inputs for these requests (rows in this order)."""
        params = [self.requests[r] for r in req_ids]

        def column(values, default, dtype):
            return None if all(v == default for v in values) else torch.tensor(values, dtype=dtype, device=self.device)

        vocab = self.vocab_size
        wanted = [vocab if p.logprobs == -1 else p.logprobs for p in params if p.logprobs is not None]
        # min_tokens: until a request has that many outputs, EOS and its stop ids cannot be sampled
        masked = [(i, sorted(t for t in p.all_stop_token_ids if t < vocab))
                  for i, (r, p) in enumerate(zip(req_ids, params))
                  if p.min_tokens and p.all_stop_token_ids and
                  batch.num_tokens_cpu[batch.req_id_to_row[r]] - self.num_prompt_tokens[r] < p.min_tokens]
        md = SamplingMetadata(
            temperature=torch.tensor([p.temperature for p in params], dtype=torch.float32, device=self.device),
            all_greedy=all(p.temperature == 0 for p in params),
            top_k=column([min(p.top_k, vocab) for p in params], 0, torch.int64),  # above the vocabulary: all of it
            top_p=column([p.top_p for p in params], 1.0, torch.float32),
            min_p=column([p.min_p for p in params], 0.0, torch.float32),
            generators=[self.generators.get(r, self.generator) for r in req_ids],
            max_num_logprobs=max(wanted) if wanted else None,
            min_tokens_masks=masked)
        if self.processing_reqs and not self.processing_reqs.isdisjoint(req_ids):
            self._add_logits_processing(md, req_ids, params, batch)
        return md

    def _add_logits_processing(self, md: SamplingMetadata, req_ids: list[str], params: list[SamplingParams],
                               batch: InputBatch) -> None:
        """Fill the whitelist, bad-word, bias and penalty parts of md for the rows that use them."""
        vocab, dev = self.vocab_size, self.device
        rows = [i for i, r in enumerate(req_ids) if r in self.processing_reqs]

        def outputs(i: int) -> np.ndarray:  # what request i sampled so far, from its row of token ids
            row, r = batch.req_id_to_row[req_ids[i]], req_ids[i]
            return batch.token_ids_cpu[row, self.num_prompt_tokens[r]:batch.num_tokens_cpu[row]]

        masked = [i for i in rows if req_ids[i] in self.allowed_token_ids_masks]
        if masked:
            mask = torch.zeros(len(req_ids), vocab, dtype=torch.bool, device=dev)
            for i in masked:
                mask[i] = self.allowed_token_ids_masks[req_ids[i]]
            md.allowed_token_ids_mask = mask
        bad = {i: params[i].bad_words_token_ids for i in rows if params[i].bad_words_token_ids}
        if bad:
            md.bad_words_token_ids = bad
            md.output_token_ids = [outputs(i).tolist() if i in bad else [] for i in range(len(req_ids))]
        biased = [(i, t, b) for i in rows if params[i].logit_bias for t, b in params[i].logit_bias.items()]
        if biased:
            md.logit_bias = (torch.tensor([i for i, _, _ in biased], dtype=torch.int64, device=dev),
                             torch.tensor([t for _, t, _ in biased], dtype=torch.int64, device=dev),
                             torch.tensor([b for _, _, b in biased], dtype=torch.float32, device=dev))
        penalized = [i for i in rows if params[i].presence_penalty or params[i].frequency_penalty
                     or params[i].repetition_penalty != 1.0]
        if penalized:
            def padded(arrays: list[np.ndarray]) -> torch.Tensor:  # right-padded with vocab, which counts nowhere
                out = np.full((len(arrays), max(1, max(len(a) for a in arrays))), vocab, dtype=np.int64)
                for j, a in enumerate(arrays):
                    out[j, :len(a)] = a
                return torch.from_numpy(out).to(dev)

            prompts = [batch.token_ids_cpu[batch.req_id_to_row[req_ids[i]], :self.num_prompt_tokens[req_ids[i]]]
                       for i in penalized]

            def column(name: str) -> torch.Tensor:
                return torch.tensor([getattr(params[i], name) for i in penalized], dtype=torch.float32, device=dev)

            md.penalties = PenaltyMetadata(
                rows=torch.tensor(penalized, dtype=torch.int64, device=dev),
                presence_penalties=column("presence_penalty"), frequency_penalties=column("frequency_penalty"),
                repetition_penalties=column("repetition_penalty"),
                prompt_token_ids=padded(prompts), output_token_ids=padded([outputs(i) for i in penalized]))
