"""Mirror of vllm/entrypoints/llm.py: LLM, the public facade for offline generation.

`LLM(...)` packs its keyword arguments into one validated EngineConfig and
builds an LLMEngine from it. `generate()` is `add_request` for each prompt,
then `while has_unfinished_requests(): step()`, collecting finished outputs in
input order. Left out: beam search, embeddings and other pooling tasks, LoRA.
"""
from __future__ import annotations

import dataclasses
import threading
from typing import Sequence

from tqdm import tqdm

from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.processor import parse_prompts
from minivllm.entrypoints.chat_utils import apply_hf_chat_template, prepare_chat_render
from minivllm.logger import init_logger
from minivllm.outputs import RequestOutput
from minivllm.sampling_params import SamplingParams

PromptType = str | list[int] | dict  # dicts as vLLM's TextPrompt / TokensPrompt


class LLM:
    def __init__(self, model: str | None = None, **engine_args) -> None:
        init_logger()
        multiprocess = engine_args.pop("multiprocess", None)
        unknown = sorted(set(engine_args) - {f.name for f in dataclasses.fields(EngineArgs)})
        if unknown:
            raise ValueError(f"Unknown engine argument(s) {unknown}: minivllm takes "
                             f"{sorted(f.name for f in dataclasses.fields(EngineArgs))}.")
        self.llm_engine = LLMEngine.from_engine_args(EngineArgs(model=model, **engine_args), multiprocess=multiprocess)
        self._lock = threading.Lock()  # one generate() at a time drives the engine; other threads wait their turn

    def get_tokenizer(self):
        return self.llm_engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """As vLLM: the model's generation_config.json defaults, or SamplingParams() if it sets none."""
        return self.llm_engine.get_default_sampling_params()

    def start_profile(self) -> None:
        """Start the torch profiler inside EngineCore (needs profiler_config); stop_profile() writes the trace."""
        self.llm_engine.start_profile()

    def stop_profile(self) -> None:
        self.llm_engine.stop_profile()

    def reset_prefix_cache(self) -> bool:
        """As vLLM: drop every cached prefix block (e.g. between benchmark runs); False while requests run."""
        return self.llm_engine.reset_prefix_cache()

    def generate(self, prompts: PromptType | Sequence[PromptType],
                 sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
                 use_tqdm: bool = True, priority: list[int] | None = None) -> list[RequestOutput]:
        prompts = parse_prompts(prompts)  # the same normalisation as /v1/completions
        if sampling_params is None:  # as vLLM: the model's own defaults (generation_config="auto")
            sampling_params = self.get_default_sampling_params()
        params = _as_params_list(sampling_params, len(prompts))
        if priority is None:
            priority = [0] * len(prompts)
        elif not isinstance(priority, (list, tuple)) or len(priority) != len(prompts):
            got = f"{len(priority)} priorities" if isinstance(priority, (list, tuple)) else repr(priority)
            raise ValueError(f"priority must be a list with one int per prompt: got {got} for {len(prompts)} "
                             f"prompts.")
        engine = self.llm_engine
        with self._lock:
            # Validate everything before sending anything: a bad prompt leaves the engine untouched.
            processed = [engine.process_inputs(engine.next_request_id(), p, sp, pr)
                         for p, sp, pr in zip(prompts, params, priority)]
            engine.add_processed_requests(processed)
            request_ids = [request.request_id for _, request in processed]
            return self._run_engine(request_ids, use_tqdm)

    def chat(self, messages: list[dict] | list[list[dict]], sampling_params=None, use_tqdm: bool = True,
             chat_template: str | None = None, add_generation_prompt: bool = True,
             continue_final_message: bool = False, chat_template_kwargs: dict | None = None) -> list[RequestOutput]:
        """Render one conversation (or a list of them) with a chat template, then generate.

        As vLLM: the template is the tokenizer's unless `chat_template` (Jinja text) is given; the
        rendered text is the output's `prompt` and is tokenized without adding special tokens again.
        Messages and options go through chat_utils.prepare_chat_render, as /v1/chat/completions.
        """
        tokenizer = self.get_tokenizer()
        conversations = [messages] if isinstance(messages, list) and messages and isinstance(messages[0], dict) \
            else messages
        if not isinstance(conversations, list) or not conversations:
            raise ValueError(f"chat() takes a conversation (a list of {{'role', 'content'}} dicts) or a list of them, "
                             f"got {type(conversations).__name__}.")
        # every conversation through the server's code path (chat_utils); rendered here, as the caller is trusted
        renders = [prepare_chat_render(conversation, tokenizer_template=tokenizer.chat_template,
                                       chat_template=chat_template, add_generation_prompt=add_generation_prompt,
                                       continue_final_message=continue_final_message,
                                       chat_template_kwargs=chat_template_kwargs)
                   for conversation in conversations]
        prompts = []
        for render in renders:
            text = apply_hf_chat_template(tokenizer, render)
            prompts.append({"prompt": text, "prompt_token_ids": tokenizer.encode(text, add_special_tokens=False)})
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)

    def _run_engine(self, request_ids: list[str], use_tqdm: bool) -> list[RequestOutput]:
        engine = self.llm_engine
        finished: dict[str, RequestOutput] = {}
        pending = set(request_ids)
        try:
            with tqdm(total=len(request_ids), desc="Processed prompts", disable=not use_tqdm,
                      dynamic_ncols=True) as bar:
                while pending and engine.has_unfinished_requests():
                    for output in engine.step():
                        if output.finished and output.request_id in pending:
                            finished[output.request_id] = output
                            pending.discard(output.request_id)
                            bar.update(1)
        finally:
            if pending:  # interrupted: abort what is left so no block stays held
                engine.abort_request(list(pending))
        return [finished[r] for r in request_ids]

    def shutdown(self) -> None:
        self.llm_engine.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def _as_params_list(sampling_params, n: int) -> list[SamplingParams]:
    if isinstance(sampling_params, SamplingParams):
        return [sampling_params] * n
    params = list(sampling_params)
    if len(params) != n:
        raise ValueError(f"Got {len(params)} SamplingParams for {n} prompts: pass one, or one per prompt.")
    return params
