"""Mirror of vllm/entrypoints/openai/serving_chat.py: POST /v1/chat/completions.

The conversation is rendered with the model's chat template (or the request's `chat_template`, only
on a server started with --trust-request-chat-template, as vLLM) in a child process bounded in time,
memory and output (minivllm/entrypoints/chat_utils.py), and tokenized on the engine's tokenizer thread
without adding special tokens again; messages and options go through prepare_chat_render, the code
LLM.chat runs too. Then it is one engine request with n samples.
Streamed: a first chunk per choice carries `role: assistant`, then one chunk per step with the new
content, the last (once per choice) with its finish_reason, then the usage chunk if asked for.
Left out, and refused by name: tools and tool_choice, response_format; left out: reasoning parsers,
multimodal parts, `echo`.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import AsyncGenerator

from minivllm.entrypoints.chat_utils import ChatTemplateRenderer, prepare_chat_render
from minivllm.entrypoints.openai.protocol import (ChatCompletionLogProb, ChatCompletionLogProbs,
                                                  ChatCompletionLogProbsContent, ChatCompletionRequest,
                                                  ChatCompletionResponse, ChatCompletionResponseChoice,
                                                  ChatResponseMessage)
from minivllm.entrypoints.openai.serving_completion import stream_text_delta
from minivllm.entrypoints.openai.serving_engine import AbortOnClose, OpenAIServing, sse
from minivllm.outputs import CompletionOutput, RequestOutput


class OpenAIServingChat(OpenAIServing):
    def __init__(self, engine_client, served_model_name: str, trust_request_chat_template: bool = False) -> None:
        super().__init__(engine_client, served_model_name)
        self.trust_request_chat_template = trust_request_chat_template
        self.renderer = ChatTemplateRenderer(engine_client.model_folder, self.max_prompt_chars)
        self.render_executor = ThreadPoolExecutor(1, thread_name_prefix="minivllm-chat-template")

    def shutdown(self) -> None:
        self.renderer.shutdown()
        self.render_executor.shutdown(wait=False, cancel_futures=True)

    async def render(self, request: ChatCompletionRequest, params) -> tuple[dict, object]:
        """The same conversation parsing and options as LLM.chat (prepare_chat_render), rendered in the child."""
        render = prepare_chat_render(request.messages, tokenizer_template=self.engine_client.tokenizer.chat_template,
                                     chat_template=request.chat_template,
                                     add_generation_prompt=request.add_generation_prompt,
                                     continue_final_message=request.continue_final_message,
                                     chat_template_kwargs=request.chat_template_kwargs,
                                     trust_chat_template=self.trust_request_chat_template)
        text = await asyncio.get_running_loop().run_in_executor(self.render_executor, self.renderer.render, render)
        return await self.prepare_prompt(text, params, add_special_tokens=False)

    async def create_chat_completion(self, request: ChatCompletionRequest, request_id: str | None = None
                                     ) -> ChatCompletionResponse | AbortOnClose:
        self.check_model(request.model)
        params = request.to_sampling_params(self.default_sampling_params)
        self.check_params(params)
        request_id = self.request_id("chatcmpl", request_id)
        inputs, params = await self.render(request, params)
        collector = await self.engine_client.add_request(request_id, inputs, params, request.priority)
        outputs = self.engine_client.iterate(request_id, collector)
        if request.stream:
            return AbortOnClose(self.chat_stream(request, request_id, outputs), self.engine_client, [request_id])
        final = None
        try:
            async for final in outputs:
                pass
        finally:
            self.engine_client.abort([request_id])  # cancelled (the client left): give it back
        choices = [ChatCompletionResponseChoice(
            index=c.index, message=ChatResponseMessage(role="assistant", content=c.text),
            logprobs=self.logprobs(c, 0, request), finish_reason=c.finish_reason, stop_reason=c.stop_reason)
            for c in final.outputs]
        return ChatCompletionResponse(id=request_id, model=self.served_model_name, choices=choices,
                                      usage=self.usage([final]))

    async def chat_stream(self, request: ChatCompletionRequest, request_id: str,
                          outputs) -> AsyncGenerator[str, None]:
        def chunk(choices, usage=None) -> str:
            response = ChatCompletionResponse(id=request_id, object="chat.completion.chunk",
                                              model=self.served_model_name, choices=choices, usage=usage)
            return sse(response.model_dump_json(exclude_none=True))

        final: RequestOutput | None = None
        sent_text = [0] * request.n
        sent_tokens = [0] * request.n
        finished = [False] * request.n  # a choice's finish_reason is sent once, never again
        yield chunk([ChatCompletionResponseChoice(index=i, delta=ChatResponseMessage(role="assistant", content=""))
                     for i in range(request.n)])
        try:
            async for final in outputs:
                for c in final.outputs:
                    if finished[c.index]:
                        continue
                    finished[c.index] = c.finished()
                    delta = stream_text_delta(c, sent_text[c.index], request.stop)
                    if not delta and not c.finished():
                        continue
                    logprobs = self.logprobs(c, sent_tokens[c.index], request)
                    sent_text[c.index] += len(delta)
                    sent_tokens[c.index] = len(c.token_ids)
                    yield chunk([ChatCompletionResponseChoice(
                        index=c.index, delta=ChatResponseMessage(content=delta), logprobs=logprobs,
                        finish_reason=c.finish_reason, stop_reason=c.stop_reason)])
            if request.stream_options and request.stream_options.include_usage:
                yield chunk([], self.usage([final]))
        except Exception as e:
            yield self.stream_error(e)
        finally:
            await outputs.aclose()  # the client went away mid-stream: iterate()'s finally aborts the request
        yield sse("[DONE]")

    def logprobs(self, c: CompletionOutput, start: int,
                 request: ChatCompletionRequest) -> ChatCompletionLogProbs | None:
        """OpenAI's chat logprobs from token `start` on: each sampled token and its top_logprobs alternatives."""
        if not request.logprobs or c.logprobs is None:
            return None
        tokenizer = self.engine_client.tokenizer

        def entry(tid, logprob) -> ChatCompletionLogProb:
            token = logprob.decoded_token if logprob.decoded_token is not None else tokenizer.decode([tid])
            return ChatCompletionLogProb(token=token, logprob=max(logprob.logprob, -9999.0),
                                         bytes=list(token.encode("utf-8")))

        content = []
        for token_id, entries in zip(c.token_ids[start:], c.logprobs[start:]):
            top = sorted(entries, key=lambda t: entries[t].rank)[:request.top_logprobs or 0]
            sampled = entry(token_id, entries[token_id])
            content.append(ChatCompletionLogProbsContent(**sampled.model_dump(),
                                                         top_logprobs=[entry(t, entries[t]) for t in top]))
        return ChatCompletionLogProbs(content=content)
