"""The runner's prompt logprobs, computed chunk by chunk as a prompt's prefill runs (vLLM's
GPUModelRunner._get_prompt_logprobs_dict and its in-progress dict).

As vLLM: the row of prompt position p predicts prompt token p + 1, so a prompt of P tokens has P - 1 prompt
logprobs. Each prefill chunk fills its slice; the whole list goes out in the step that runs the last chunk
(which also samples the first output token). A request preempted mid-prefill refills its slices. Rows go through
lm_head CHUNK at a time, so a long prompt never holds [P, vocab_size] logits at once.
"""
from __future__ import annotations

import torch

from minivllm.sample.sampler import Sampler


class PromptLogprobs:
    CHUNK = 256  # rows through lm_head at a time: [chunk, vocab_size] floats

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.num_prompt_logprobs: dict[str, int] = {}  # req_id -> alternatives wanted, while still prefilling
        self.in_progress: dict[str, list] = {}  # req_id -> the entries its chunks filled so far

    def __bool__(self) -> bool:
        return bool(self.num_prompt_logprobs)

    def add_request(self, req_id: str, k: int) -> None:
        self.num_prompt_logprobs[req_id] = self.vocab_size if k == -1 else k

    def remove_request(self, req_id: str) -> None:
        self.num_prompt_logprobs.pop(req_id, None)
        self.in_progress.pop(req_id, None)

    def compute(self, b, hidden_states: torch.Tensor, model, input_batch, num_prompt_tokens: dict) -> dict:
        """{req_id: every prompt logprob} for the requests whose last prompt chunk ran in PackedBatch `b`."""
        done: dict[str, list] = {}
        qsl = b.query_start_loc.tolist()
        for i, req_id in enumerate(b.req_ids):
            k = self.num_prompt_logprobs.get(req_id)
            if k is None:
                continue
            num_prompt = num_prompt_tokens[req_id]
            start, num_scheduled = int(b.num_computed_tokens[i]), int(b.num_scheduled_tokens[i])
            entries = self.in_progress.setdefault(req_id, [None] * (num_prompt - 1))
            num_logits = min(num_scheduled, num_prompt - 1 - start)
            row = input_batch.req_id_to_row[req_id]
            for lo in range(0, max(num_logits, 0), self.CHUNK):
                hi = min(num_logits, lo + self.CHUNK)
                logits = model.compute_logits(hidden_states[qsl[i] + lo:qsl[i] + hi])  # [hi - lo, vocab]
                targets = torch.from_numpy(input_batch.token_ids_cpu[row, start + lo + 1:start + hi + 1])
                computed = Sampler._logprobs(logits.float(), targets.to(logits.device), k)  # raw, as vLLM's
                lp, rank, top_ids, top_lp = (t.tolist() for t in computed)
                for j in range(hi - lo):
                    entries[start + lo + j] = (lp[j], rank[j], list(zip(top_ids[j], top_lp[j])))
            if start + num_scheduled >= num_prompt:
                done[req_id] = entries
        for req_id in done:
            self.remove_request(req_id)
        return done
