"""`python -m minivllm trace-serve`: watch an online server admit requests between the steps of others.

Starts `minivllm serve`'s app (uvicorn on a thread of this process, EngineCore in its child) with
tracing on, then three clients (the official openai client, each on its own thread) stream
completions at different moments: B sends once A has streamed 3 tokens, C once B has streamed 2.
Then it prints every engine step from the trace (who was scheduled, how many tokens, the queues)
and names the steps where a request was admitted while others were decoding. Timing decides the
exact step numbers, so they differ run to run; the admissions-while-decoding are always there.
It turns on only what it uses, tracing in this process's engine (`enable_tracing_async`), and prints its
own clients' prompts; the server it starts has no /trace page (that needs `serve --enable-trace-page`).
"""
from __future__ import annotations

import argparse
import threading

from minivllm.tracing.render import make_console, put, terminal_width
from minivllm.tracing.text import fmt_list

CLIENTS = [("A", "Once upon a time", 24, None), ("B", "The capital of France is", 16, ("A", 3)),
           ("C", "def fibonacci(n):", 8, ("B", 2))]  # (name, prompt, max_tokens, (waits for client, tokens))


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="model folder, .gguf file or cached hub id (default: SmolLM2)")
    p.add_argument("--width", type=int, default=None, help="columns (default: the terminal's, 80 when piped)")


def short(request_id: str) -> str:
    """cmpl-A-0 -> A (the X-Request-Id each client sent)."""
    return request_id.removeprefix("cmpl-").rsplit("-", 1)[0]


def admitted_while_decoding(trace) -> list[tuple[int, list[str], list[str]]]:
    """(step, admitted, decoding): steps whose schedule() admitted a request while others decoded one token."""
    found = []
    for e in trace.of_kind("schedule"):
        new = [n["req_id"] for n in e["scheduled_new_reqs"]]
        decoding = [r for r in e["scheduled_cached_reqs"]["req_ids"] if e["num_scheduled_tokens"][r] == 1]
        if new and decoding:
            found.append((e["step"], [short(r) for r in new], [short(r) for r in decoding]))
    return found


def run_clients(url: str, model: str) -> dict[str, str]:
    import openai
    counts = {name: 0 for name, *_ in CLIENTS}  # chunks streamed so far, per client
    texts: dict[str, str] = {}
    lock = threading.Condition()

    def client(name: str, prompt: str, max_tokens: int, wait) -> None:
        if wait is not None:
            with lock:
                lock.wait_for(lambda: counts[wait[0]] >= wait[1], timeout=120)
        api = openai.OpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=120)
        text = ""
        for chunk in api.completions.create(model=model, prompt=prompt, max_tokens=max_tokens, temperature=0,
                                            stream=True, extra_headers={"X-Request-Id": name},
                                            extra_body={"ignore_eos": True}):
            text += chunk.choices[0].text
            with lock:
                counts[name] += 1
                lock.notify_all()
        texts[name] = text

    threads = [threading.Thread(target=client, args=c, name=f"client-{c[0]}") for c in CLIENTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    return texts


def run_serve_trace(args: argparse.Namespace, console=None):
    from minivllm.engine.arg_utils import EngineArgs
    from minivllm.engine.async_llm import AsyncLLM
    from minivllm.entrypoints.openai.api_server import ServerThread
    console = console or make_console(width=args.width or terminal_width())
    server = ServerThread(AsyncLLM.from_engine_args(EngineArgs(model=args.model, max_model_len=256)),
                          enable_trace_page=False)  # the trace is read here, in-process: no page to serve
    try:
        trace = server.run_coroutine(server.engine.enable_tracing_async())
        texts = run_clients(server.url, server.engine.served_model_name)
    finally:
        server.stop()
    console.rule("minivllm serve: three clients, one EngineCore")
    for e in trace.events:
        if e["kind"] == "submit":
            put(console, "[server]     ", f"POST /v1/completions from client {short(e['request_id'])}: "
                                          f"{len(e['prompt_token_ids'])} prompt tokens -> EngineCore's input queue")
        elif e["kind"] == "schedule":
            parts = [f"{short(r)}:{'decode' if n == 1 else f'prefill {n}'}"
                     for r, n in e["num_scheduled_tokens"].items()]
            running = [short(r) for r in e["running"]]
            put(console, f"[EngineCore] step {e['step']:>2}  ", "  ".join(parts) + f"  RUNNING {fmt_list(running)}"
                f"  free {e['num_free_blocks']}")
        elif e["kind"] == "update":
            for out in e["outputs"]:
                if out["finish_reason"]:
                    put(console, f"[EngineCore] step {e['step']:>2}  ", f"{short(out['request_id'])} finished "
                                                                       f"({out['finish_reason']}), its blocks freed")
    found = admitted_while_decoding(trace)
    for step, new, decoding in found:
        put(console, "", f"step {step}: {', '.join(new)} admitted while {', '.join(decoding)} decoded")
    for name, text in sorted(texts.items()):
        put(console, f"client {name}: ", repr(text))
    if not found:
        raise AssertionError("no request was admitted while others decoded: the clients did not overlap")
    return trace, found
