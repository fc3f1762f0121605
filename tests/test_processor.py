"""One front end (engine/processor.py, chat_utils.prepare_chat_render): LLMEngine, AsyncLLM, LLM and the server
turn the same input into the same EngineCoreRequest, from one resolved EngineConfig.
"""
from __future__ import annotations

import dataclasses

import pytest

from minivllm import LLM, SamplingParams
from minivllm.engine import processor as processor_module
from minivllm.engine.arg_utils import EngineArgs
from minivllm.engine.async_llm import AsyncLLM
from minivllm.engine.llm_engine import LLMEngine
from minivllm.engine.processor import Processor, parse_prompts
from minivllm.entrypoints.chat_utils import prepare_chat_render
from minivllm.entrypoints.openai.protocol import ChatMessage

VOCAB = 49152
pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def resolve_calls(tiny_llama_folder):
    """Both engines built with dtype="auto", counting how often the config is resolved (dtype and sizes)."""
    calls = []
    real = processor_module.resolve_dtype

    def counting(*args):
        calls.append(args)
        return real(*args)

    processor_module.resolve_dtype = counting
    try:
        args = EngineArgs(model=str(tiny_llama_folder), dtype="auto", max_model_len=64, num_gpu_blocks_override=32)
        offline = LLMEngine.from_engine_args(args, multiprocess=False)
        offline_calls = len(calls)
        online = AsyncLLM.from_engine_args(args)
    finally:
        processor_module.resolve_dtype = real
    yield offline, online, offline_calls, len(calls) - offline_calls
    offline.shutdown()
    online.shutdown()


def _without_time(request):
    return dataclasses.replace(request, arrival_time=0.0)


def test_dtype_auto_is_resolved_once_per_engine_in_one_place(resolve_calls):
    offline, online, offline_calls, online_calls = resolve_calls
    assert (offline_calls, online_calls) == (1, 1)
    assert offline.config.dtype in ("float32", "bfloat16") and offline.config == online.config
    assert offline.processor.config == online.processor.config == offline.config


@pytest.mark.parametrize("prompt", ["Hello there", [1, 2, 3], {"prompt": "Hi"}, {"prompt_token_ids": [5, 6]},
                                    {"prompt": "Hi", "prompt_token_ids": [7]}])
def test_both_engines_build_identical_engine_core_requests(resolve_calls, prompt):
    offline, online, _, _ = resolve_calls
    assert type(offline.processor) is type(online.processor) is Processor
    params = SamplingParams(max_tokens=5, temperature=0.8, seed=3, n=3, stop=["x"], bad_words=["Hello"],
                            logprobs=2, min_tokens=1)
    text_a, request_a = offline.process_inputs("r", prompt, params, 2)
    text_b, request_b = online.process_inputs("r", prompt, params, 2)
    assert text_a == text_b and _without_time(request_a) == _without_time(request_b)
    children_a = [(_without_time(c), i) for c, _, i in offline.processor.fan_out(request_a)]
    children_b = [(_without_time(c), i) for c, _, i in online.processor.fan_out(request_b)]
    assert children_a == children_b
    assert [c.request_id for c, _ in children_a] == ["0_r", "1_r", "2_r"]
    assert [c.sampling_params.seed for c, _ in children_a] == [3, 4, 5]


@pytest.mark.parametrize("engine_index", [0, 1])
def test_both_engines_refuse_the_same_bad_input_in_the_same_words(resolve_calls, engine_index):
    engine = resolve_calls[engine_index]
    with pytest.raises(ValueError, match=f"Token id {VOCAB} is out of vocabulary"):
        engine.process_inputs("r", [1, VOCAB], SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="max_model_len=64"):
        engine.process_inputs("r", [1] * 64, SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="logit_bias has 1 token ids outside the vocabulary"):
        engine.process_inputs("r", "Hi", SamplingParams(max_tokens=2, logit_bias={VOCAB + 5: 1.0}))


def test_offline_out_of_vocabulary_prompt_says_what_vllm_and_the_server_say(tiny_llama_folder):
    with LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, num_gpu_blocks_override=16) as llm:
        with pytest.raises(ValueError, match=f"Token id {VOCAB} is out of vocabulary"):
            llm.generate([[1, 2, VOCAB]], SamplingParams(max_tokens=2), use_tqdm=False)
        with pytest.raises(ValueError, match="Token id -1 is out of vocabulary"):
            llm.generate({"prompt_token_ids": [-1]}, SamplingParams(max_tokens=2), use_tqdm=False)
        # chat: template from chat_template_kwargs and text parts, as the server takes them (one code path)
        out = llm.chat([{"role": "user", "content": [{"type": "text", "text": "Hello"}]}],
                       SamplingParams(max_tokens=1), use_tqdm=False,
                       chat_template_kwargs={"chat_template": "{{ messages[0]['content'] }}!"})
        assert out[0].prompt == "Hello!"


def test_chat_options_and_messages_take_one_path_for_llm_and_the_server():
    dicts = [{"role": "system", "content": "Be brief"}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]
    models = [ChatMessage(**m) for m in dicts]
    options = dict(tokenizer_template="T", add_generation_prompt=False, continue_final_message=True,
                   chat_template_kwargs={"enable_thinking": False})
    assert prepare_chat_render(dicts, **options) == prepare_chat_render(models, **options)
    render = prepare_chat_render(dicts, **options)
    assert render.conversation[1] == {"role": "user", "content": "Hi"}
    assert render.options == {"add_generation_prompt": False, "continue_final_message": True,
                              "enable_thinking": False}
    with pytest.raises(ValueError, match="trust-request-chat-template"):
        prepare_chat_render(dicts, tokenizer_template="T", chat_template_kwargs={"chat_template": "x"},
                            trust_chat_template=False)
    with pytest.raises(ValueError, match="set add_generation_prompt=False"):
        prepare_chat_render(dicts, tokenizer_template="T", continue_final_message=True)
    with pytest.raises(ValueError, match="tokenize"):
        prepare_chat_render(dicts, tokenizer_template="T", chat_template_kwargs={"tokenize": True})


def test_prompt_normalisation_is_one_function_for_llm_and_completions():
    assert parse_prompts("Hi") == ["Hi"]
    assert parse_prompts([1, 2]) == [[1, 2]]
    assert parse_prompts(["a", [1], {"prompt": "b"}]) == ["a", [1], {"prompt": "b"}]
    for bad in ([], [""], [3.5]):
        with pytest.raises(ValueError):
            parse_prompts(bad)
