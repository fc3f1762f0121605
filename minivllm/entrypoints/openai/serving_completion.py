"""Mirror of vllm/entrypoints/openai/serving_completion.py: POST /v1/completions.

Each prompt of the request (a string, token ids, or a list of either) is one engine request; with
n samples, choice `index` is prompt_index * n + sample_index, as vLLM. Streamed, every step that
adds text sends one chunk per choice that moved, and each choice's finish_reason comes exactly once
(vLLM's test_parallel_streaming: n chunks with a finish_reason for n choices); while stop strings are pending, the last
len(longest stop) - 1 characters are held back, since a stop string found later cuts them off
(vLLM's detokenizer holds them back the same way). Left out: echo, suffix, best_of, prompt_logprobs.
"""
from __future__ import annotations

from typing import AsyncGenerator

from minivllm.engine.processor import parse_prompts
from minivllm.entrypoints.openai.protocol import (MAX_PROMPTS, CompletionLogProbs, CompletionRequest,
                                                  CompletionResponse, CompletionResponseChoice)
from minivllm.entrypoints.openai.serving_engine import AbortOnClose, OpenAIServing, merge_async_iterators, sse
from minivllm.outputs import CompletionOutput, RequestOutput


def stream_text_delta(completion: CompletionOutput, sent: int, stop: list[str] | str | None) -> str:
    """The text not sent yet that no later stop string can take back."""
    text = completion.text
    if completion.finished() or not stop:
        return text[sent:]
    hold = max(len(s) for s in ([stop] if isinstance(stop, str) else stop)) - 1
    return text[sent:max(sent, len(text) - hold)]


class OpenAIServingCompletion(OpenAIServing):
    async def create_completion(self, request: CompletionRequest, request_id: str | None = None
                                ) -> CompletionResponse | AbortOnClose:
        """Check and submit every prompt (a ValueError here is a 400), then answer whole or as a stream."""
        self.check_model(request.model)
        params = request.to_sampling_params(self.default_sampling_params)
        prompts = parse_prompts(request.prompt)  # as LLM.generate: one prompt or a batch, each text or token ids
        if len(prompts) > MAX_PROMPTS:
            raise ValueError(f"prompt holds {len(prompts)} prompts, more than {MAX_PROMPTS}: split the request.")
        self.check_params(params)
        request_id = self.request_id("cmpl", request_id)
        engine, submitted = self.engine_client, []
        try:
            for i, prompt in enumerate(prompts):
                rid = f"{request_id}-{i}"
                inputs, fitted = await self.prepare_prompt(prompt, params)
                submitted.append((rid, await engine.add_request(rid, inputs, fitted, request.priority)))
        except BaseException:
            engine.abort([rid for rid, _ in submitted])
            raise
        streams = [engine.iterate(rid, collector) for rid, collector in submitted]
        ids = [rid for rid, _ in submitted]
        if request.stream:
            return AbortOnClose(self.completion_stream(request, request_id, streams, params.n), engine, ids)
        try:
            return await self.completion_full(request, request_id, streams)
        finally:
            engine.abort(ids)  # cancelled (the client left): give back what is still running

    async def completion_full(self, request: CompletionRequest, request_id: str, streams) -> CompletionResponse:
        final: dict[int, RequestOutput] = {}
        async for i, output in merge_async_iterators(*streams):
            final[i] = output
        outputs = [final[i] for i in range(len(streams))]
        choices = []
        for i, output in enumerate(outputs):
            for c in output.outputs:
                choices.append(CompletionResponseChoice(
                    index=i * request.n + c.index, text=c.text, finish_reason=c.finish_reason,
                    stop_reason=c.stop_reason, logprobs=self.logprobs(c, 0, len(c.token_ids), 0, request.logprobs)))
        return CompletionResponse(id=request_id, model=self.served_model_name, choices=choices,
                                  usage=self.usage(outputs))

    async def completion_stream(self, request: CompletionRequest, request_id: str, streams,
                                n: int) -> AsyncGenerator[str, None]:
        sent_text: dict[int, int] = {}  # choice index -> characters sent
        sent_tokens: dict[int, int] = {}  # choice index -> tokens whose logprobs were sent
        finished: set[int] = set()  # choices whose finish_reason was sent: never sent again
        final: dict[int, RequestOutput] = {}
        merged = merge_async_iterators(*streams)
        try:
            async for i, output in merged:
                final[i] = output
                for c in output.outputs:
                    index = i * n + c.index
                    if index in finished:
                        continue
                    text_done, token_done = sent_text.get(index, 0), sent_tokens.get(index, 0)
                    delta = stream_text_delta(c, text_done, request.stop)
                    if not delta and not c.finished():
                        continue
                    sent_text[index], sent_tokens[index] = text_done + len(delta), len(c.token_ids)
                    if c.finished():
                        finished.add(index)
                    choice = CompletionResponseChoice(
                        index=index, text=delta, finish_reason=c.finish_reason, stop_reason=c.stop_reason,
                        logprobs=self.logprobs(c, token_done, len(c.token_ids), text_done, request.logprobs))
                    chunk = CompletionResponse(id=request_id, model=self.served_model_name, choices=[choice])
                    yield sse(chunk.model_dump_json(exclude_none=True))
            if request.stream_options and request.stream_options.include_usage:
                usage = self.usage([final[i] for i in sorted(final)])
                chunk = CompletionResponse(id=request_id, model=self.served_model_name, choices=[], usage=usage)
                yield sse(chunk.model_dump_json(exclude_none=True))
        except Exception as e:  # the engine died mid-stream: say so in the stream
            yield self.stream_error(e)
        finally:
            await merged.aclose()  # a client gone mid-stream: cancel every prompt's generator, aborting it
        yield sse("[DONE]")

    def logprobs(self, c: CompletionOutput, start: int, end: int, text_offset: int,
                 num_logprobs: int | None) -> CompletionLogProbs | None:
        """OpenAI's completion logprobs for tokens [start, end): the sampled token's, and the top alternatives."""
        if num_logprobs is None or c.logprobs is None:
            return None
        result = CompletionLogProbs()
        tokenizer = self.engine_client.tokenizer
        for token_id, entries in zip(c.token_ids[start:end], c.logprobs[start:end]):
            def text(tid):
                return entries[tid].decoded_token if entries[tid].decoded_token is not None \
                    else tokenizer.decode([tid])
            token = text(token_id)
            result.tokens.append(token)
            result.token_logprobs.append(max(entries[token_id].logprob, -9999.0))
            top = [token_id] + sorted(entries, key=lambda t: entries[t].rank)[:num_logprobs]  # sampled + top k
            result.top_logprobs.append({text(t): max(entries[t].logprob, -9999.0) for t in top})
            result.text_offset.append(text_offset)
            text_offset += len(token)
        return result
