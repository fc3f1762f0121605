"""vLLM's offline API on minivllm: the calls vLLM's example scripts make, re-expressed as tests.

Each test makes the calls one of vLLM's examples/offline_inference scripts makes (only the model and
`vllm` -> `minivllm` changed), and checks what the script prints or relies on.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import weakref

import pytest

from minivllm import LLM, EngineArgs, LLMEngine, RequestOutput, SamplingParams
from minivllm.distributed import cleanup_dist_env_and_memory
from minivllm.utils import FlexibleArgumentParser
from minivllm.utils.argparse_utils import FlexibleArgumentParser as FlexibleArgumentParser2

PROMPTS = ["Hello, my name is", "The president of the United States is", "The capital of France is",
           "The future of AI is"]
SMALL = dict(max_model_len=64, num_gpu_blocks_override=64)


def test_every_engine_argument_has_a_flag_with_help():
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    text = parser.format_help()
    for field in dataclasses.fields(EngineArgs):
        assert "--" + field.name.replace("_", "-") in text
    assert FlexibleArgumentParser is FlexibleArgumentParser2


def test_cli_flags_round_trip_and_underscores_are_accepted(tiny_llama_folder):
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(["--model", str(tiny_llama_folder), "--max_model_len=64", "--no-enable-chunked-prefill",
                              "--max-num-batched-tokens", "64", "--scheduling-policy", "priority",
                              "--profiler-config", '{"profiler": "torch", "torch_profiler_dir": "/tmp/p"}'])
    engine_args = EngineArgs.from_cli_args(args)
    assert engine_args.max_model_len == 64 and engine_args.enable_chunked_prefill is False
    assert engine_args.scheduling_policy == "priority" and engine_args.profiler_config["profiler"] == "torch"
    assert EngineArgs() == EngineArgs.from_cli_args(EngineArgs.add_cli_args(FlexibleArgumentParser()).parse_args([]))
    with pytest.raises(SystemExit):
        parser.parse_args(["--profiler-config", "{not json"])


def test_generate_example_cli_defaults_and_model_sampling_defaults(tiny_llama_folder):
    # generate.py: engine flags in an argument group, sampling flags beside them, LLM(**vars(args)),
    # then get_default_sampling_params() with only the given flags overriding it.
    parser = FlexibleArgumentParser()
    EngineArgs.add_cli_args(parser.add_argument_group("Engine arguments"))
    sampling = parser.add_argument_group("Sampling parameters")
    for flag, kind in (("--max-tokens", int), ("--temperature", float), ("--top-p", float), ("--top-k", int)):
        sampling.add_argument(flag, type=kind)
    args = vars(parser.parse_args(["--model", str(tiny_llama_folder), "--max-model-len", "64", "--max-tokens", "5"]))
    max_tokens, temperature = args.pop("max_tokens"), args.pop("temperature")
    args.pop("top_p"), args.pop("top_k")
    llm = LLM(**args, multiprocess=False)
    params = llm.get_default_sampling_params()
    assert params == SamplingParams()  # the tiny model's generation_config.json sets no sampling value
    params.max_tokens = max_tokens
    assert temperature is None
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    assert [o.prompt for o in outputs] == PROMPTS and all(len(o.outputs[0].token_ids) == 5 for o in outputs)
    llm.shutdown()


def test_generation_config_auto_reads_the_model_defaults_and_vllm_ignores_them(tiny_llama_folder, tmp_path):
    folder = tmp_path / "model"
    folder.mkdir()
    for f in tiny_llama_folder.iterdir():
        os.symlink(f, folder / f.name)
    (folder / "generation_config.json").unlink()
    (folder / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_new_tokens": 7, "do_sample": True}))
    llm = LLM(str(folder), multiprocess=False, **SMALL)
    params = llm.get_default_sampling_params()
    assert (params.temperature, params.top_p, params.top_k, params.max_tokens) == (0.6, 0.9, 20, 7)
    out = llm.generate(["Hello"], use_tqdm=False)[0]  # no SamplingParams: the model's defaults apply
    assert len(out.outputs[0].token_ids) == 7
    llm.shutdown()
    llm = LLM(str(folder), multiprocess=False, generation_config="vllm", **SMALL)
    assert llm.get_default_sampling_params() == SamplingParams()
    llm.shutdown()
    with pytest.raises(ValueError, match="generation_config"):
        LLM(str(folder), multiprocess=False, generation_config=str(tmp_path / "nowhere"), **SMALL)


def test_chat_example_one_conversation_a_batch_and_a_template(tiny_llama_folder, tmp_path, capsys):
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=256, num_gpu_blocks_override=256)
    params = SamplingParams(max_tokens=4, temperature=0)
    conversation = [{"role": "system", "content": "You are a helpful assistant"},
                    {"role": "user", "content": "Hello"},
                    {"role": "assistant", "content": "Hello! How can I assist you today?"},
                    {"role": "user", "content": "Write an essay about the importance of higher education."}]
    one = llm.chat(conversation, params, use_tqdm=False)
    assert len(one) == 1 and one[0].prompt.startswith("<|im_start|>system\nYou are a helpful assistant")
    assert one[0].prompt.endswith("<|im_start|>assistant\n")  # add_generation_prompt
    batch = llm.chat([conversation for _ in range(10)], params, use_tqdm=True)
    assert len(batch) == 10 and {o.outputs[0].text for o in batch} == {one[0].outputs[0].text}
    assert "Processed prompts" in capsys.readouterr().err  # the batch shows its progress bar
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}[assistant]")
    custom = llm.chat([conversation] * 2, params, use_tqdm=False, chat_template=template.read_text())
    assert custom[0].prompt.startswith("[system] You are a helpful assistant\n[user] Hello\n")
    assert custom[0].prompt_token_ids == llm.get_tokenizer().encode(custom[0].prompt, add_special_tokens=False)
    with pytest.raises(ValueError, match="add_generation_prompt=False"):
        llm.chat(conversation, params, continue_final_message=True)
    llm.shutdown()


def test_llm_engine_example_step_loop(tiny_llama_folder):
    # llm_engine_example.py: EngineArgs from the command line, LLMEngine.from_engine_args, then one
    # add_request per step until nothing is unfinished, printing each finished RequestOutput.
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(description="LLMEngine directly"))
    args = parser.parse_args(["--model", str(tiny_llama_folder), "--max-model-len", "64"])
    engine = LLMEngine.from_engine_args(EngineArgs.from_cli_args(args), multiprocess=False)
    todo = [("A robot may not injure a human being", SamplingParams(temperature=0.0, logprobs=1, prompt_logprobs=1)),
            ("To be or not to be,", SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.2)),
            ("What is the meaning of life?", SamplingParams(n=2, best_of=5, temperature=0.8,
                                                             top_p=0.95, frequency_penalty=0.1))]
    finished: dict[str, RequestOutput] = {}
    request_id = 0
    while todo or engine.has_unfinished_requests():
        if todo:
            prompt, params = todo.pop(0)
            engine.add_request(str(request_id), prompt, params)
            request_id += 1
        for output in engine.step():
            if output.finished:
                assert output.request_id not in finished
                finished[output.request_id] = output
                assert "RequestOutput(request_id=" in str(output)
    assert sorted(finished) == ["0", "1", "2"]
    first = finished["0"]
    assert first.prompt_logprobs[0] is None and len(first.prompt_logprobs) == len(first.prompt_token_ids)
    assert all(len(d) in (1, 2) for d in first.outputs[0].logprobs)
    assert [c.index for c in finished["2"].outputs] == [0, 1]
    engine.shutdown()


def test_engine_args_are_checked_before_the_model_loads():
    with pytest.raises(ValueError, match=re.escape("Total number of attention heads (9) must be divisible by "
                                                   "tensor parallel size (2).")):
        LLM(tensor_parallel_size=2)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        LLM(gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be a finite number"):
        LLM(gpu_memory_utilization=float("nan"))
    with pytest.raises(ValueError, match="only the 'torch' profiler"):
        LLM(profiler_config={"profiler": "cuda"})
    with pytest.raises(ValueError, match="torch_profiler_dir"):
        LLM(profiler_config={"profiler": "torch"})
    with pytest.raises(ValueError, match="does not support"):
        LLM(profiler_config={"profiler": "torch", "torch_profiler_dir": "x", "delay_iterations": 3})
    with pytest.raises(ValueError, match="Unknown engine argument"):
        LLM(max_num_seq=4)
    with pytest.raises(ValueError, match="EngineArgs"):
        LLMEngine.from_engine_args({"model": None})


@pytest.mark.parametrize("multiprocess", [False, True], ids=["inproc", "mp"])
def test_simple_profiling_writes_a_torch_trace(tiny_llama_folder, tmp_path, multiprocess):
    folder = tmp_path / "profile"
    llm = LLM(str(tiny_llama_folder), multiprocess=multiprocess, tensor_parallel_size=1, enforce_eager=True,
              profiler_config={"profiler": "torch", "torch_profiler_dir": str(folder),
                               "torch_profiler_with_stack": False}, **SMALL)
    with pytest.raises(RuntimeError, match="not running"):
        llm.stop_profile()
    llm.start_profile()
    outputs = llm.generate(PROMPTS, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=4), use_tqdm=False)
    llm.stop_profile()  # returns once the trace is on disk: no sleep needed
    assert len(outputs) == 4
    traces = list(folder.glob("EngineCore_pid*.pt.trace.json.gz"))
    assert len(traces) == 1
    import gzip
    events = json.loads(gzip.decompress(traces[0].read_bytes()))["traceEvents"]
    assert any("aten::" in e.get("name", "") for e in events)  # the forward passes were recorded
    llm.shutdown()
    no_profiler = LLM(str(tiny_llama_folder), multiprocess=False, **SMALL)
    with pytest.raises(ValueError, match="profiler_config"):
        no_profiler.start_profile()
    no_profiler.shutdown()


def test_gpu_memory_utilization_sizes_the_kv_cache_from_free_memory(tiny_llama_folder):
    from minivllm.core.kv_cache_utils import available_memory_bytes, kv_cache_bytes_per_block
    from minivllm.models.loader import load_config
    llm = LLM(str(tiny_llama_folder), multiprocess=False, max_model_len=64, gpu_memory_utilization=0.001)
    per_block = kv_cache_bytes_per_block(load_config(tiny_llama_folder), 16, 4)
    blocks = llm.llm_engine.info["num_gpu_blocks"]
    expected = 0.001 * available_memory_bytes() / per_block
    assert 0.5 * expected < blocks < 2 * expected  # MemAvailable moves a little between the two reads
    llm.shutdown()


@pytest.mark.parametrize("multiprocess", [False, True], ids=["inproc", "mp"])
def test_del_then_cleanup_frees_the_engine(tiny_llama_folder, multiprocess):
    # prefix_caching.py: `del llm; cleanup_dist_env_and_memory()` before building a second LLM.
    llm = LLM(str(tiny_llama_folder), multiprocess=multiprocess, gpu_memory_utilization=0.01, max_model_len=64)
    llm.generate(PROMPTS, SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    client = llm.llm_engine.engine_core
    process = getattr(client, "process", None)
    core = weakref.ref(client.engine_core) if not multiprocess else None
    del llm, client
    cleanup_dist_env_and_memory()
    if multiprocess:
        process.join(timeout=60)  # bounds a hang: a busy machine takes seconds to end a process
        assert not process.is_alive()
    else:
        assert core() is None
    again = LLM(str(tiny_llama_folder), multiprocess=multiprocess, gpu_memory_utilization=0.01, max_model_len=64)
    assert len(again.generate(PROMPTS, SamplingParams(max_tokens=2), use_tqdm=False)) == 4
    again.shutdown()


def test_reproducibility_example_seeds_the_callers_random_state(tiny_llama_folder):
    # reproducibility.py: in-process, LLM(seed=42), sampling, then random.randint prints the same each run.
    script = f"""
import os, random
os.environ["MINIVLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from minivllm import LLM, SamplingParams
llm = LLM(model={str(tiny_llama_folder)!r}, seed=42, max_model_len=64)
outs = llm.generate({PROMPTS!r}, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=4), use_tqdm=False)
print([o.outputs[0].token_ids for o in outs], random.randint(0, 100))
"""
    runs = [subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
            for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[0].stderr[-2000:]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.strip()


def test_prefix_caching_examples_same_answers_with_the_cache(tiny_llama_folder):
    # prefix_caching.py / automatic_prefix_caching.py: a long shared prefix, a baseline LLM without the cache,
    # then one with enable_prefix_caching=True warmed by the first prompt: the same greedy answers, served from
    # cached blocks.
    prefix = ("You are an expert school principal, skilled in effectively managing faculty and staff. Draft "
              "10-15 questions for a potential first grade Head Teacher. Based on these information, fulfill "
              "the following paragraph: ")
    prompts = [prefix + p for p in PROMPTS]
    params = SamplingParams(temperature=0.0, max_tokens=6)
    regular = LLM(str(tiny_llama_folder), multiprocess=False, enable_prefix_caching=False,
                  gpu_memory_utilization=0.01, max_model_len=256)
    baseline = [o.outputs[0].text for o in regular.generate(prompts, params, use_tqdm=False)]
    del regular
    cleanup_dist_env_and_memory()
    cached = LLM(str(tiny_llama_folder), multiprocess=False, enable_prefix_caching=True,
                 gpu_memory_utilization=0.01, max_model_len=256)
    cached.generate(prompts[0], params, use_tqdm=False)  # warm-up: the shared prefix's blocks get cached
    outputs = cached.generate(prompts, params, use_tqdm=False)
    assert [o.outputs[0].text for o in outputs] == baseline
    assert all(o.num_cached_tokens >= 16 for o in outputs)  # every prompt found the prefix's full blocks
    stats = cached.llm_engine.get_stats()
    assert stats["prefix_cache_hits"] > 0
    cached.shutdown()
