"""Mirror of vllm/v1/engine/output_processor.py and detokenizer.py: token ids -> RequestOutput.

Runs in the caller's process. Each request detokenizes incrementally (only the
new tokens are decoded, with a few tokens of context so word boundaries come
out right) and checks its stop strings on the new text; a request stopped by a
string is reported in `reqs_to_abort` so EngineCore frees it. The children of
an n > 1 request report through their ParentRequest: one RequestOutput under
the parent's id. Prompt logprobs arrive once, with a request's first token.
Left out: streaming deltas, metrics.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from minivllm.engine import EngineCoreOutput
from minivllm.engine.parallel_sampling import ParentRequest
from minivllm.outputs import CompletionOutput, Logprob, RequestOutput
from minivllm.sampling_params import SamplingParams


class IncrementalDetokenizer:
    CONTEXT = 6  # prompt tokens kept as left context for the first output token

    def __init__(self, tokenizer, prompt_token_ids: list[int], skip_special_tokens: bool) -> None:
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.tokens = list(prompt_token_ids[-self.CONTEXT:])
        self.prefix_offset, self.read_offset = 0, len(self.tokens)
        self.output_text = ""

    def update(self, new_token_ids: list[int]) -> str:
        """Decode [prefix_offset:] and keep what goes past the already-read text; wait on partial UTF-8."""
        delta = ""
        for token_id in new_token_ids:
            self.tokens.append(token_id)
            prefix = self._decode(self.tokens[self.prefix_offset:self.read_offset])
            text = self._decode(self.tokens[self.prefix_offset:])
            if len(text) > len(prefix) and not text.endswith("\ufffd"):
                delta += text[len(prefix):]
                self.prefix_offset, self.read_offset = self.read_offset, len(self.tokens)
        self.output_text += delta
        return delta

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip) if ids else ""


@dataclass
class RequestState:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    params: SamplingParams
    detokenizer: IncrementalDetokenizer
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float = 0.0
    parent: ParentRequest | None = None  # set for a child of an n > 1 request
    index: int = 0  # which of the parent's n samples this is
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None


@dataclass
class OutputProcessorOutput:
    request_outputs: list[RequestOutput]
    reqs_to_abort: list[str]


class OutputProcessor:
    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.request_states: dict[str, RequestState] = {}
        self.parent_requests: dict[str, ParentRequest] = {}

    def add_request(self, request_id: str, prompt: str | None, prompt_token_ids: list[int],
                    params: SamplingParams, parent: ParentRequest | None = None, index: int = 0) -> None:
        detok = IncrementalDetokenizer(self.tokenizer, prompt_token_ids, params.skip_special_tokens)
        self.request_states[request_id] = RequestState(request_id, prompt, prompt_token_ids, params, detok,
                                                       logprobs=[] if params.logprobs is not None else None,
                                                       parent=parent, index=index)
        if parent is not None:
            self.parent_requests[parent.request_id] = parent

    def has_unfinished_requests(self) -> bool:
        return bool(self.request_states)

    def abort_requests(self, request_ids: list[str]) -> list[str]:
        """Forget these requests; a parent id stands for its unfinished children. Returns the ids EngineCore knows."""
        to_abort = []
        for request_id in request_ids:
            state = self.request_states.pop(request_id, None)
            if state is not None:
                to_abort.append(request_id)
                if state.parent is not None:
                    state.parent.child_requests.discard(request_id)
                    if not state.parent.child_requests:
                        self.parent_requests.pop(state.parent.request_id, None)
            elif (parent := self.parent_requests.pop(request_id, None)) is not None:
                to_abort.extend(self.abort_requests(sorted(parent.child_requests)))
        return to_abort

    def process_outputs(self, outputs: list[EngineCoreOutput]) -> OutputProcessorOutput:
        # by request id, a parent's children under the parent's: one output each, in first-seen order
        request_outputs: dict[str, RequestOutput] = {}
        reqs_to_abort = []
        for out in outputs:
            state = self.request_states.get(out.request_id)
            if state is None:
                continue  # aborted here already (stop string, interrupt): late tokens are dropped
            finish_reason, stop_reason = out.finish_reason, out.stop_reason
            # As vLLM: a stop token (EOS or a stop_token_ids hit) stays in token_ids but not in the text.
            to_decode = out.new_token_ids
            if out.finish_reason == "stop" and not state.params.include_stop_str_in_output:
                to_decode = to_decode[:-1]
            # Token by token: with speculative decoding a step brings several, and a stop string completed by one
            # of them ends the request at that token; the tokens after it are dropped. Stop strings are not looked
            # for until min_tokens outputs exist (vLLM's detokenizer).
            stop, kept = None, len(out.new_token_ids)
            for i, token_id in enumerate(to_decode):
                delta = state.detokenizer.update([token_id])
                if len(state.token_ids) + i + 1 > state.params.min_tokens and \
                        (stop := self._check_stop_strings(state, delta)) is not None:
                    kept = i + 1
                    break
            for i, token_id in enumerate(out.new_token_ids[:kept]):
                if state.logprobs is not None and out.new_logprobs and i < len(out.new_logprobs):
                    state.logprobs.append(self._logprobs(state, token_id, out.new_logprobs[i]))
                    state.cumulative_logprob += out.new_logprobs[i][0]
                state.token_ids.append(token_id)
            if out.new_prompt_logprobs is not None:
                state.prompt_logprobs = self._prompt_logprobs(state, out.new_prompt_logprobs)
            if stop is not None:
                finish_reason, stop_reason = "stop", stop
                if out.finish_reason is None:
                    reqs_to_abort.append(out.request_id)
            completion = CompletionOutput(state.index, state.detokenizer.output_text, list(state.token_ids),
                                          finish_reason, stop_reason, state.logprobs,
                                          state.cumulative_logprob if state.logprobs is not None else None)
            finished = finish_reason is not None
            if finished:
                del self.request_states[out.request_id]
            parent = state.parent
            if parent is None:
                request_outputs[state.request_id] = RequestOutput(
                    state.request_id, state.prompt, state.prompt_token_ids, [completion], finished,
                    state.prompt_logprobs, num_cached_tokens=out.num_cached_tokens)
                continue
            if parent.prompt_logprobs is None:
                parent.prompt_logprobs = state.prompt_logprobs
            completions, all_finished = parent.get_outputs(out.request_id, completion)
            request_outputs[parent.request_id] = RequestOutput(
                parent.request_id, state.prompt, state.prompt_token_ids, completions, all_finished,
                parent.prompt_logprobs, num_cached_tokens=out.num_cached_tokens)  # as vLLM: the reporting child's
            if all_finished:
                self.parent_requests.pop(parent.request_id, None)
        return OutputProcessorOutput(list(request_outputs.values()), reqs_to_abort)

    def _prompt_logprobs(self, state: RequestState,
                         entries: list[tuple[float, int, list[tuple[int, float]]]]) -> list[dict[int, Logprob] | None]:
        """As vLLM's RequestOutput.prompt_logprobs: None for the first token, then one dict per prompt token."""
        ids = state.prompt_token_ids
        return [None] + [self._logprob_dict(ids[:pos], ids[pos], entry) for pos, entry in enumerate(entries, 1)]

    @staticmethod
    def _check_stop_strings(state: RequestState, delta: str) -> str | None:
        """Find a stop string that the new text completed; cut the text before it (or after, if kept)."""
        if not delta or not state.params.stop:
            return None
        detok = state.detokenizer
        for stop in state.params.stop:
            start = max(0, len(detok.output_text) - len(delta) - len(stop) + 1)
            index = detok.output_text.find(stop, start)
            if index != -1:
                end = index + len(stop) if state.params.include_stop_str_in_output else index
                detok.output_text = detok.output_text[:end]
                return stop
        return None

    def _logprobs(self, state: RequestState, token_id: int,
                  entry: tuple[float, int, list[tuple[int, float]]]) -> dict[int, Logprob]:
        """As vLLM returns them: the sampled token first (with its rank), then the top alternatives by rank.

        Each token's text is decoded after the tokens before it, so a token that completes a
        multi-byte character reads as that character, not U+FFFD.
        """
        context = list(state.prompt_token_ids[-self.DECODE_CONTEXT:]) + state.token_ids[-self.DECODE_CONTEXT:]
        return self._logprob_dict(context, token_id, entry)

    def _logprob_dict(self, before: list[int], token_id: int,
                      entry: tuple[float, int, list[tuple[int, float]]]) -> dict[int, Logprob]:
        logprob, rank, top = entry
        ids = [token_id] + [tid for tid, _ in top if tid != token_id]
        values = {token_id: (logprob, rank)} | {tid: (lp, r + 1) for r, (tid, lp) in enumerate(top) if tid != token_id}
        context = before[-self.DECODE_CONTEXT:]
        texts = self._decode_after(context, ids)
        return {tid: Logprob(*values[tid], text) for tid, text in zip(ids, texts)}

    DECODE_CONTEXT = 4  # tokens of left context: enough for any UTF-8 character split across tokens
    MAX_CONTEXT_DECODES = 32  # past this (logprobs=-1: the whole vocabulary) tokens are decoded alone

    def _decode_after(self, context: list[int], ids: list[int]) -> list[str]:
        """Each id's text after `context`; "" for a token that only starts a character (vLLM's LogprobsProcessor).

        E.g. "日" is two byte tokens in SmolLM2: the first alone would read "\ufffd", so it reads "", and
        the second, decoded after the first, reads "日".
        """
        if len(ids) > self.MAX_CONTEXT_DECODES:
            texts = self.tokenizer.batch_decode([[t] for t in ids])
        else:
            before = self.tokenizer.decode(context).rstrip("\ufffd")
            texts = []
            for token_id in ids:
                both = self.tokenizer.decode(context + [token_id])
                texts.append(both[len(before):] if both.startswith(before) else self.tokenizer.decode([token_id]))
        return ["" if text.endswith("\ufffd") else text for text in texts]
