"""Mirror of vllm/v1/engine/parallel_sampling.py: n > 1 as n child requests of one parent.

EngineCore never sees a parent. The caller-side engine turns a request with
`n` samples into n ordinary requests, ids "{index}_{parent id}", each with its
own copy of the params at n=1 (and, if seeded, seed + index, so the samples
differ and each repeats run to run). The output processor folds the children's
completions back into one RequestOutput under the parent's id, finished when
the last child is. Aborting the parent aborts the children still running.
With best_of > n, best_of children run and the n with the highest cumulative
logprob are returned, re-indexed 0..n-1 (vLLM V0's best_of); each child then
tracks its sampled tokens' logprobs even if the caller asked for none.
Left out: streaming each child on its own (vLLM's DELTA/CUMULATIVE kinds): a
parent's output always carries the latest completion of every child so far.
"""
from __future__ import annotations

import copy
import dataclasses

from minivllm.outputs import CompletionOutput
from minivllm.sampling_params import SamplingParams


class ParentRequest:
    def __init__(self, request_id: str, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.sampling_params = sampling_params
        self.child_requests: set[str] = set()  # children not finished yet
        self.output_aggregator: list[CompletionOutput | None] = [None] * sampling_params.num_samples
        self.prompt_logprobs = None  # the same for every child: kept from the first that reports them

    def get_child_info(self, index: int) -> tuple[str, SamplingParams]:
        """The id and params of child `index`; the parent counts it as running from now on."""
        child_id = f"{index}_{self.request_id}"
        self.child_requests.add(child_id)
        params = copy.copy(self.sampling_params)  # shallow: children share the read-only lists and sets
        params.n, params.best_of = 1, None
        if self.sampling_params.num_samples > self.sampling_params.n and params.logprobs is None:
            params.logprobs = 0  # best_of ranks by cumulative logprob: the sampled token's logprob is needed
        if params.seed is not None:
            params.seed = self.sampling_params.seed + index
        return child_id, params

    def get_outputs(self, child_id: str, completion: CompletionOutput) -> tuple[list[CompletionOutput], bool]:
        """Record a child's latest completion; return the completions so far (by index) and whether all are done."""
        if completion.finished():
            self.child_requests.discard(child_id)
        self.output_aggregator[completion.index] = completion
        done = not self.child_requests
        completions = [c for c in self.output_aggregator if c is not None]
        n = self.sampling_params.n
        if done and len(completions) > n:  # best_of: keep the n most likely samples
            best = sorted(completions, key=lambda c: c.cumulative_logprob, reverse=True)[:n]
            hide = self.sampling_params.logprobs is None  # the caller asked for no logprobs
            completions = [dataclasses.replace(c, index=i, logprobs=None if hide else c.logprobs)
                           for i, c in enumerate(best)]
        return completions, done
