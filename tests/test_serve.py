"""`minivllm serve`: the official openai client against a real server on 127.0.0.1, over the same EngineCore.

One in-process server (uvicorn on a thread) with SmolLM2 serves most tests; the EngineCore-killed and
SIGTERM tests start `python -m minivllm serve` as a process on the tiny random Llama.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import openai
import pytest

MODEL = "SmolLM2-135M-Instruct"
LONG_PROMPT = ("In a paged KV cache, every request owns a list of physical blocks, and the block table maps each "
               "logical block to one of them, much like a page table in an operating system.")


@pytest.fixture(scope="module")
def server():
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    thread = ServerThread(AsyncLLM.from_engine_args(EngineArgs(max_model_len=256)))
    yield thread
    thread.stop()
    assert not thread.thread.is_alive()
    assert not thread.engine.engine_core.process.is_alive()  # the lifespan's exit stopped EngineCore


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url, api_key="EMPTY", max_retries=0, timeout=120)


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _post_lines(url: str, body: dict) -> list[str]:
    """The raw lines of a streamed response (SSE framing as sent)."""
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        return response.read().decode().split("\n")


def _metric(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name + "{"))


def test_serve_help_lists_the_server_and_engine_flags():
    out = subprocess.run([sys.executable, "-m", "minivllm", "serve", "--help"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--host", "--port", "--served-model-name", "--max-num-seqs", "--enable-prefix-caching"):
        assert flag in out.stdout


def test_models_and_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert _get(server.url.removesuffix("/v1") + "/health")[0] == 200


def test_completion_whole_and_streamed_give_the_same_greedy_text(client):
    whole = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert whole.choices[0].finish_reason == "length"
    assert whole.usage.completion_tokens == 12 and whole.usage.prompt_tokens == 4 and whole.usage.total_tokens == 16
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=12, temperature=0,
                                            stream=True, stream_options={"include_usage": True}))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_stream_is_server_sent_events_ending_with_done(server):
    lines = _post_lines(server.url + "/completions", {"prompt": "Hi", "max_tokens": 3, "temperature": 0,
                                                      "stream": True})
    events = [line for line in lines if line]
    assert all(line.startswith("data: ") for line in events)
    assert events[-1] == "data: [DONE]"
    assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"


def test_chat_uses_the_chat_template_streamed_and_not(server, client):
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_completion_tokens=10, temperature=0)
    tokenizer = server.engine.tokenizer
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert whole.usage.prompt_tokens == len(tokenizer.encode(rendered, add_special_tokens=False))
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    chunks = list(client.chat.completions.create(model=MODEL, messages=messages, max_tokens=10, temperature=0,
                                                 stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason


def test_sampling_fields_n_seed_stop_logprobs_and_extra_body(client):
    kwargs = dict(model=MODEL, prompt=["1, 2, 3,", "Once upon a time"], max_tokens=6, temperature=0.8, n=2,
                  seed=7, logprobs=2, extra_body={"top_k": 20, "min_p": 0.01})
    first, again = client.completions.create(**kwargs), client.completions.create(**kwargs)
    assert [c.index for c in first.choices] == [0, 1, 2, 3]  # prompt_index * n + sample_index
    assert [c.text for c in first.choices] == [c.text for c in again.choices]  # seeded: repeats
    assert len(first.choices[0].logprobs.tokens) == 6 and len(first.choices[0].logprobs.top_logprobs[0]) >= 2
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=20, temperature=0, stop=[" 5"])
    assert stopped.choices[0].finish_reason == "stop" and stopped.choices[0].text == " 4,"
    streamed = client.completions.create(model=MODEL, prompt="1, 2, 3,", max_tokens=20, temperature=0, stop=[" 5"],
                                         stream=True)
    assert "".join(c.choices[0].text for c in streamed) == " 4,"  # the held-back " " never went out
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                          temperature=0, logprobs=True, top_logprobs=3)
    assert all(len(t.top_logprobs) == 3 for t in chat.choices[0].logprobs.content)


def test_usage_reports_prefix_cache_hits(client):
    client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2, temperature=0)
    again = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=2, temperature=0)
    assert again.usage.prompt_tokens_details.cached_tokens >= 16  # whole blocks of the same prompt


@pytest.mark.parametrize("kwargs, status, param", [
    ({"model": "no-such-model"}, 404, "model"),
    ({"temperature": -1.0}, 400, None),
    ({"max_tokens": "many"}, 400, "max_tokens"),
    ({"prompt": "hello " * 300}, 400, None),  # over max_model_len=256
    ({"echo": True}, 400, None),
])
def test_errors_are_openai_error_objects_and_the_engine_stays_up(server, client, kwargs, status, param):
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(**({"model": MODEL, "prompt": "Hi", "max_tokens": 2} | kwargs))
    assert info.value.status_code == status
    error = info.value.body if "error" not in info.value.body else info.value.body["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status and error["message"]
    assert error["param"] == param
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2).usage.completion_tokens == 2


def test_metrics_use_vllm_names(server, client):
    before = _get(server.url.removesuffix("/v1") + "/metrics")[1].decode()
    client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=5, temperature=0)
    status, text = _get(server.url.removesuffix("/v1") + "/metrics")
    text = text.decode()
    assert status == 200
    for name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                 "vllm:time_to_first_token_seconds_bucket"):
        assert name + "{" in text
    assert _metric(text, "vllm:generation_tokens_total") - _metric(before, "vllm:generation_tokens_total") == 5
    assert _metric(text, "vllm:prompt_tokens_total") - _metric(before, "vllm:prompt_tokens_total") == 4
    assert _metric(text, "vllm:time_to_first_token_seconds_count") > \
        _metric(before, "vllm:time_to_first_token_seconds_count")


@pytest.mark.timeout(600)  # bounds a hang; run alone, the module's server starts inside it
def test_a_client_that_disconnects_mid_stream_aborts_its_request(server, client):
    stats = server.run_coroutine(server.engine.get_stats_async())
    assert stats["num_unfinished"] == 0
    stream = client.completions.create(model=MODEL, prompt=LONG_PROMPT, max_tokens=200, temperature=0,
                                       stream=True, extra_body={"ignore_eos": True})
    received = [next(iter(stream)) for _ in range(3)]
    assert all(c.choices[0].finish_reason is None for c in received)
    generated = _metric(_get(server.url.removesuffix("/v1") + "/metrics")[1].decode(),
                        "vllm:generation_tokens_total")
    stream.close()  # the client goes away
    while True:
        stats = server.run_coroutine(server.engine.get_stats_async())
        if not stats["num_unfinished"] and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1:
            break
        time.sleep(0.05)
    assert not server.engine.collectors
    text = _get(server.url.removesuffix("/v1") + "/metrics")[1].decode()
    assert _metric(text, "vllm:generation_tokens_total") - generated < 200 - 3  # aborted before max_tokens


@pytest.mark.timeout(600)  # as above
def test_a_client_that_gives_up_on_a_whole_response_aborts_its_request(server):
    metrics = server.url.removesuffix("/v1") + "/metrics"
    generated = _metric(_get(metrics)[1].decode(), "vllm:generation_tokens_total")
    body = {"prompt": LONG_PROMPT, "max_tokens": 200, "temperature": 0, "ignore_eos": True}
    request = urllib.request.Request(server.url + "/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    with pytest.raises(OSError):  # the client stops waiting and closes the connection
        urllib.request.urlopen(request, timeout=1)
    while True:
        stats = server.run_coroutine(server.engine.get_stats_async())
        if not stats["num_unfinished"] and stats["num_free_blocks"] == stats["num_gpu_blocks"] - 1:
            break
        time.sleep(0.05)
    assert _metric(_get(metrics)[1].decode(), "vllm:generation_tokens_total") - generated < 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _children(pid: int) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry))
    return found


@pytest.fixture
def serve_process(tiny_llama_folder):
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", str(tiny_llama_folder), "--port", str(port),
                             "--num-gpu-blocks-override", "64", "--uvicorn-log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        while _get_or_none(base + "/health") != 200:
            assert proc.poll() is None, proc.stdout.read()
            time.sleep(0.2)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


def _get_or_none(url: str) -> int | None:
    try:
        return _get(url)[0]
    except OSError:
        return None


def _engine_core_pid(proc) -> int:
    pids = [p for p in _children(proc.pid) if "spawn_main" in open(f"/proc/{p}/cmdline").read()]
    assert len(pids) == 1, pids
    return pids[0]


@pytest.mark.timeout(600)  # bounds a hang; the server's start (a process importing torch) is inside it
def test_killed_engine_core_turns_health_503_and_requests_500_then_sigterm_exits(serve_process):
    proc, base = serve_process
    client = openai.OpenAI(base_url=base + "/v1", api_key="EMPTY", max_retries=0, timeout=60)
    model = client.models.list().data[0].id
    assert client.completions.create(model=model, prompt="Hi", max_tokens=3).usage.completion_tokens == 3
    stream = iter(client.completions.create(model=model, prompt="Hi", max_tokens=480, stream=True,
                                            extra_body={"ignore_eos": True}))
    next(stream)
    os.kill(_engine_core_pid(proc), signal.SIGKILL)
    with pytest.raises(openai.APIError, match="EngineCore"):  # the stream in flight ends with the error
        for _ in stream:
            pass
    while _get(base + "/health")[0] != 503:
        time.sleep(0.1)
    with pytest.raises(openai.InternalServerError) as info:
        client.completions.create(model=model, prompt="Hi", max_tokens=3)
    assert "EngineCore" in info.value.body["message"] if "message" in info.value.body else \
        "EngineCore" in info.value.body["error"]["message"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


@pytest.mark.timeout(600)  # as above
def test_sigterm_stops_the_server_and_its_engine_core(serve_process):
    proc, base = serve_process
    core = _engine_core_pid(proc)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 60  # a bound on a hang, not an assertion on time (normally under 2 s)
    while os.path.exists(f"/proc/{core}") and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not os.path.exists(f"/proc/{core}") or "zombie" in open(f"/proc/{core}/status").read().lower()


@pytest.mark.timeout(300)
def test_trace_serve_shows_requests_admitted_while_others_decode():
    import argparse
    import io

    from minivllm.tracing.render import make_console
    from minivllm.entrypoints.cli.serve_trace import run_serve_trace
    out = io.StringIO()
    trace, found = run_serve_trace(argparse.Namespace(model=None, width=80), make_console(out, 80))
    admitted = {name for _, new, _ in found for name in new}
    assert {"B", "C"} <= admitted  # each later client joined a batch that was decoding
    text = out.getvalue()
    assert "B admitted while A" in text and "A finished (length)" in text
