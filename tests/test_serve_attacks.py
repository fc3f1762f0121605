"""`minivllm serve` under a hostile or careless client (issue 23), and vLLM's own server cases re-expressed.

One in-process server (uvicorn on a thread, SmolLM2, max_model_len=256) serves most tests; the chat
template attacks, --dtype auto and SIGTERM run `python -m minivllm serve --dtype auto` as a process
(SmolLM2 again, so that a 2,000-token stream is still running seconds later), started with
--trust-request-chat-template.
Every test is bounded in time; liveness (/health answers while X is in flight) is an order of events, never a time.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

MODEL = "SmolLM2-135M-Instruct"
RUNAWAY = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}x"


@pytest.fixture(scope="module")
def server():
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    thread = ServerThread(AsyncLLM.from_engine_args(EngineArgs(max_model_len=256)))
    yield thread
    thread.stop()


def _request(url: str, body: bytes | None = None, method: str | None = None,
             timeout: float = 60) -> tuple[int, dict | bytes]:
    request = urllib.request.Request(url, body, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw


def _post(server, path: str, body: dict, timeout: float = 120) -> tuple[int, dict]:
    return _request(server.url + path, json.dumps(body).encode(), timeout=timeout)


def _assert_error(status: int, body, code: int, *words: str) -> str:
    """An OpenAI error object with this code; its message (one short line) holds each of `words`."""
    assert status == code, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"} and body["error"]["code"] == code
    message = body["error"]["message"]
    for word in words:
        assert word in message, message
    assert len(message) < 400 and "\n" not in message, message
    return message


def _health(base: str) -> None:
    status, _ = _request(base + "/health", timeout=30)  # the timeout only bounds a hang
    assert status == 200


def _while_in_flight(send, base: str, polls: int = 5) -> tuple[list[bool], object]:
    """Run send() on a thread; poll /health meanwhile; return, per poll, whether send() was still waiting when
    /health answered (an order of events, not a time), and send()'s result."""
    result = {}
    worker = threading.Thread(target=lambda: result.setdefault("value", send()), daemon=True)
    worker.start()
    in_flight = []
    for _ in range(polls):
        _health(base)
        in_flight.append(worker.is_alive())
        time.sleep(0.2)
    worker.join(timeout=120)
    assert not worker.is_alive()
    return in_flight, result["value"]


# --- 1. chat templates ---------------------------------------------------------------------------------------

def test_a_request_chat_template_needs_the_trust_flag(server):
    status, body = _post(server, "/chat/completions", {"model": MODEL, "max_tokens": 2, "chat_template": "{{ 'x' }}",
                                                       "messages": [{"role": "user", "content": "Hi"}]})
    _assert_error(status, body, 400, "--trust-request-chat-template")
    status, body = _post(server, "/chat/completions", {"model": MODEL, "max_tokens": 2,
                                                       "chat_template_kwargs": {"chat_template": "{{ 'x' }}"},
                                                       "messages": [{"role": "user", "content": "Hi"}]})
    _assert_error(status, body, 400, "--trust-request-chat-template")


# --- 2. size: body, prompt, n -------------------------------------------------------------------------------

def test_a_body_over_the_limit_is_a_413_error_object(server):
    body = json.dumps({"model": MODEL, "prompt": "x" * (17 << 20), "max_tokens": 1}).encode()
    status, answer = _request(server.url + "/completions", body)
    _assert_error(status, answer, 413, "--max-request-body-bytes")


@pytest.mark.timeout(600)  # bounds a hang; run alone, the module's server starts inside it
def test_a_multi_megabyte_prompt_is_refused_and_health_stays_responsive(server, monkeypatch):
    base = server.url.removesuffix("/v1")
    prompt = "hello world, " * 1_000_000  # 13 MB: the old server tokenized it on the event loop
    tokenizer, seen = server.engine.tokenizer, []
    encode = tokenizer.encode
    monkeypatch.setattr(tokenizer, "encode", lambda text, *a, **kw: seen.append(len(text)) or encode(text, *a, **kw))
    _, (status, body) = _while_in_flight(
        lambda: _post(server, "/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1}), base)
    _assert_error(status, body, 400, "characters", "max_model_len")
    assert all(n < len(prompt) for n in seen), seen  # refused before any tokenizer saw it, on any thread


@pytest.mark.parametrize("n", [257, 1_000_000])
def test_n_is_bounded(server, n):
    status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 1, "n": n})
    assert _assert_error(status, body, 400, "256") and body["error"]["param"] == "n"


# --- 3. numbers float32 cannot hold, logit_bias, max_tokens ----------------------------------------------------

def test_a_tiny_temperature_is_raised_to_0_01_with_a_warning(caplog):
    from minivllm.sampling_params import SamplingParams
    with caplog.at_level("WARNING", logger="minivllm"):
        assert SamplingParams(temperature=1e-40).temperature == 0.01
    assert "maxed it out to 0.01" in caplog.text


def test_tiny_temperature_samples_like_greedy_instead_of_garbage(server):
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "seed": 0}
    greedy = _post(server, "/completions", body | {"temperature": 0})[1]["choices"][0]["text"]
    status, tiny = _post(server, "/completions", body | {"temperature": 1e-40})
    assert status == 200 and tiny["choices"][0]["text"] == greedy and greedy.strip()


def test_logit_bias_is_clamped_to_100_as_vllms_server(server, tokenizer):
    status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4,
                                                  "temperature": 1.0, "seed": 0, "logit_bias": {"260": 1e308}})
    assert status == 200 and body["choices"][0]["text"] == tokenizer.decode([260]) * 4
    for bias in (float("inf"), float("nan")):  # no number at all: refused, not clamped
        _assert_error(*_post(server, "/completions", {"model": MODEL, "prompt": "Hi", "logit_bias": {"260": bias}}),
                      400, "logit_bias")


@pytest.mark.parametrize("field, value", [("temperature", 1e39), ("top_p", 1e-50), ("repetition_penalty", 1e-50),
                                          ("min_p", 1e-50)])
def test_values_float32_cannot_hold_are_refused(server, field, value):
    status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, field: value})
    _assert_error(status, body, 400, field)


@pytest.mark.timeout(600)  # as above
def test_max_tokens_as_vllms_server_400_past_max_model_len_and_null_up_to_it(server):
    for max_tokens in (10**12, 2**64, 253):  # the prompt has 4 tokens: 4 + 253 > 256
        status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Once upon a time",
                                                      "max_tokens": max_tokens})
        _assert_error(status, body, 400, "maximum context length is 256", "max_tokens")
    status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Once upon a time", "max_tokens": None,
                                                  "ignore_eos": True, "temperature": 0})
    assert status == 200 and body["usage"]["completion_tokens"] == 256 - body["usage"]["prompt_tokens"]


# --- 4. n > 1 streams ----------------------------------------------------------------------------------------

def _stream_events(server, path: str, body: dict) -> list[dict]:
    status, raw = _request(server.url + path, json.dumps(body | {"stream": True}).encode())
    assert status == 200
    lines = [line.removeprefix("data: ") for line in raw.decode().split("\n") if line.startswith("data: ")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


@pytest.mark.parametrize("path, body", [
    ("/completions", {"prompt": "Once upon a time"}),
    ("/chat/completions", {"messages": [{"role": "user", "content": "Tell me a story."}]})])
def test_a_stream_with_n_3_sends_exactly_3_finish_reasons(server, path, body):
    """vLLM's test_parallel_streaming: one finish_reason per choice; a finished choice is never resent.

    The stop string "e" ends each sample at a different step (seeded: the same steps every run).
    """
    events = _stream_events(server, path, body | {"model": MODEL, "n": 3, "max_tokens": 30, "temperature": 1.0,
                                                  "seed": 0, "stop": ["e"]})
    finishes = [c["index"] for e in events for c in e["choices"] if c.get("finish_reason") is not None]
    assert sorted(finishes) == [0, 1, 2]


# --- 5. vLLM's test_long_seed, out-of-vocabulary prompt ids --------------------------------------------------

def test_a_seed_outside_int64_is_a_400_as_vllms_test_long_seed(server):
    for seed in (-(2**63) - 1, 2**63):
        status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "seed": seed})
        _assert_error(status, body, 400, "seed")


def test_an_out_of_vocabulary_prompt_id_is_named_as_vllm(server):
    status, body = _post(server, "/completions", {"model": MODEL, "prompt": [1, 2, 49152], "max_tokens": 2})
    _assert_error(status, body, 400, "out of vocabulary", "49152")


# --- 6. client errors as OpenAI error objects ---------------------------------------------------------------

@pytest.mark.parametrize("body", [
    {"model": MODEL, "prompt": "\ud800", "max_tokens": 2},
    {"model": "\ud800", "prompt": "Hi", "max_tokens": 2},
    {"model": MODEL, "prompt": "Hi", "max_tokens": 2, "bad_words": ["\udfff"]},
    {"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}], "max_tokens": 2},
    {"model": MODEL, "messages": [{"role": "\ud800", "content": "Hi"}], "max_tokens": 2}])
def test_a_lone_surrogate_is_a_400(server, body):
    path = "/chat/completions" if "messages" in body else "/completions"
    status, answer = _post(server, path, body)  # json.dumps writes the surrogate as the escape \ud800
    _assert_error(status, answer, 400, "surrogate")


@pytest.mark.parametrize("raw", [b'{"model": "x", "prompt": "\xff\xfe", "max_tokens": 2}', b"[" * 100_000,
                                 b'{"prompt": "Hi", "max_tokens": ' + b"9" * 5000 + b"}"])
def test_a_body_that_is_not_json_is_an_error_object(server, raw):
    status, body = _request(server.url + "/completions", raw)
    _assert_error(status, body, 400)


def test_404_and_405_are_error_objects(server):
    _assert_error(*_request(server.url + "/no-such-route"), 404)
    _assert_error(*_request(server.url + "/completions", method="GET"), 405)


def test_a_logit_bias_error_is_one_short_line(server):
    for bias in ({f"t{i}": 1.0 for i in range(100_000)}, {str(10**6 + i): 1.0 for i in range(100_000)}):
        status, body = _post(server, "/completions", {"model": MODEL, "prompt": "Hi", "max_tokens": 2,
                                                      "logit_bias": bias})
        _assert_error(status, body, 400, "logit_bias")


# --- 7. fields minivllm does not serve are refused by name -------------------------------------------------------

@pytest.mark.parametrize("path, field, value", [
    ("/chat/completions", "response_format", {"type": "json_object"}),
    ("/chat/completions", "tools", [{"type": "function", "function": {"name": "f", "parameters": {}}}]),
    ("/completions", "prompt_logprobs", 1),
    ("/completions", "prompt_logprobs", -1),  # vLLM's test_prompt_logprobs_completion expects 400 for -1
    ("/chat/completions", "prompt_logprobs", -1)])
def test_unserved_fields_are_refused_by_name(server, path, field, value):
    body = {"model": MODEL, "max_tokens": 2, field: value}
    body |= {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path else {"prompt": "Hi"}
    _assert_error(*_post(server, path, body), 400, field)


# --- 9. the engine: a logprob's decoded_token never ends in U+FFFD ------------------------------------------------

def test_a_partial_utf8_token_decodes_as_vllm_logprobs_processor(tokenizer):
    from minivllm.engine import EngineCoreOutput
    from minivllm.engine.output_processor import OutputProcessor
    from minivllm.sampling_params import SamplingParams
    ids = tokenizer.encode("日本", add_special_tokens=False)
    partial = [t for t in ids if tokenizer.decode([t]).endswith("\ufffd")]
    assert partial  # SmolLM2 splits these characters into byte tokens
    processor = OutputProcessor(tokenizer)
    processor.add_request("r", "Hi", tokenizer.encode("Hi"), SamplingParams(logprobs=1, max_tokens=len(ids)))
    for token in ids:
        processor.process_outputs([EngineCoreOutput("r", [token], [(-0.5, 1, [(token, -0.5)])])])
    decoded = [entries[t].decoded_token for t, entries in zip(ids, processor.request_states["r"].logprobs)]
    assert not any(text.endswith("\ufffd") for text in decoded), decoded
    assert "".join(decoded) == "日本"


# --- the served process: --dtype auto, chat templates, SIGTERM ----------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def served():
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "minivllm", "serve", "--port", str(port),
                             "--dtype", "auto", "--max-model-len", "2048",
                             "--trust-request-chat-template", "--uvicorn-log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 400  # bounds a hang: a process importing torch and loading SmolLM2
        while True:
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline
            try:
                if _request(base + "/health", timeout=5)[0] == 200:
                    break
            except OSError:
                time.sleep(0.2)
        yield proc, base
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=30)


@pytest.mark.timeout(600)  # bounds a hang; the `served` process starts inside it
def test_dtype_auto_serves_and_templates_are_bounded_and_sigterm_still_stops_it(served):
    proc, base = served
    model = _request(base + "/v1/models")[1]["data"][0]["id"]
    status, body = _request(base + "/v1/completions", json.dumps(
        {"model": model, "prompt": "Hi", "max_tokens": 3}).encode())
    assert status == 200 and body["usage"]["completion_tokens"] == 3  # --dtype auto works

    def chat(template: str):
        return _request(base + "/v1/chat/completions", json.dumps(
            {"model": model, "max_tokens": 2, "chat_template": template,
             "messages": [{"role": "user", "content": "Hi"}]}).encode(), timeout=300)  # past READY_TIMEOUT_S

    _assert_error(*chat("{% for x in %}"), 400, "chat template")  # a syntax error is the client's
    _assert_error(*chat("{{ raise_exception('no system role') }}"), 400, "no system role")
    _assert_error(*chat("{{ 'x' * 10**10 }}"), 400, "chat template")  # 10 GB asked: the memory bound
    in_flight, answer = _while_in_flight(lambda: chat(RUNAWAY), base)
    _assert_error(*answer, 400, "did not finish rendering")
    assert all(in_flight), in_flight  # /health answered while the template rendered (held up to its time bound)
    assert chat("{{ messages[0]['content'] }}")[0] == 200  # a fresh renderer serves the next request

    worker = threading.Thread(target=lambda: chat(RUNAWAY), daemon=True)
    worker.start()
    _health(base)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0


@pytest.mark.timeout(600)  # as above
def test_sigterm_ends_a_running_stream_with_an_error_event_and_done(served):
    proc, base = served
    model = _request(base + "/v1/models")[1]["data"][0]["id"]
    request = urllib.request.Request(base + "/v1/completions", json.dumps(
        {"model": model, "prompt": "Hi", "max_tokens": 2000, "stream": True, "ignore_eos": True}).encode(),
        {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        assert response.readline().startswith(b"data: ")  # the stream is running
        proc.send_signal(signal.SIGTERM)
        lines = [line.strip() for line in response.read().decode().split("\n") if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    error = json.loads(lines[-2].removeprefix("data: "))
    assert error["error"]["code"] == 503 and "shutting down" in error["error"]["message"]
    assert proc.wait(timeout=60) == 0
