"""Mirror of vllm/entrypoints/chat_utils.py (its apply_hf_chat_template): chat templates rendered for the server.

A chat template is a Jinja program: a hostile or careless one (`{% for i in range(100000) %}{% for j in
range(100000) %}{% endfor %}{% endfor %}`) runs for hours, and `{{ 'x' * 10**10 }}` asks for 10 GB.
vLLM refuses a template sent with a request unless the server runs with --trust-request-chat-template,
and so does minivllm; on top of that, minivllm renders every template, the model's own included, in a
child process (ChatTemplateRenderer): bounded in time (killed after RENDER_TIMEOUT_S, then replaced), in
memory (an address-space limit) and in output size (max_chars), and never on the server's event loop.
A template that fails, runs out of time or memory, or renders too much text is the client's error: a
ValueError, so a 400. One child renders one template at a time; a slow template delays other chat
requests for at most RENDER_TIMEOUT_S, never completions or /health.
`parse_chat_messages` turns the request's messages into the template's {"role", "content"} strings.
Left out: vLLM's content-format detection, multimodal parts, tool definitions in the template.
"""
from __future__ import annotations

import multiprocessing
import os
import signal
import threading

RENDER_TIMEOUT_S = 10.0  # one rendering, from the request's arrival at the child to its answer
READY_TIMEOUT_S = 120.0  # the child loading the tokenizer (2 shared cores, a cold disk)
MEMORY_HEADROOM = 1 << 30  # address space the child may add to what it holds once ready


def parse_chat_messages(messages) -> list[dict[str, str]]:
    """Messages as {"role", "content"} strings; text parts [{"type": "text", "text": ...}] are joined."""
    conversation = []
    for i, message in enumerate(messages):
        content = message.content
        if isinstance(content, list):
            if any(part.get("type") != "text" for part in content):
                raise ValueError(f"messages[{i}].content: only 'text' parts are supported (no images or audio).")
            content = "\n".join(str(part.get("text", "")) for part in content)
        conversation.append({"role": message.role, "content": content or ""})
    return conversation


def _render_worker(conn, model_folder: str, max_chars: int) -> None:
    """The child: load the tokenizer once, then render each (messages, template, options) it is sent."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it kills us
    parent = os.getppid()

    def watch_parent() -> None:  # a parent killed by SIGKILL cannot kill us: leave on our own
        while os.getppid() == parent:
            threading.Event().wait(1.0)
        os._exit(1)

    threading.Thread(target=watch_parent, daemon=True).start()
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(model_folder)
    try:
        import resource
        with open("/proc/self/statm") as f:
            size = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        resource.setrlimit(resource.RLIMIT_AS, (size + MEMORY_HEADROOM, size + MEMORY_HEADROOM))
    except (ImportError, OSError, ValueError):  # no /proc or no rlimit (not Linux): the time bound remains
        pass
    conn.send(("ready", None))
    while True:
        try:
            messages, template, options = conn.recv()
        except (EOFError, OSError):
            return
        try:
            text = tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False, **options)
            if not isinstance(text, str):
                raise TypeError(f"the template rendered a {type(text).__name__}, not text")
            if len(text) > max_chars:
                conn.send(("error", f"the chat template rendered {len(text)} characters, more than the "
                                    f"{max_chars} that max_model_len tokens can hold"))
            else:
                conn.send(("ok", text))
        except MemoryError:
            conn.send(("error", f"the chat template needed more than {MEMORY_HEADROOM >> 20} MiB"))
        except Exception as e:  # jinja2's TemplateError, a raise_exception() in the template, a bad kwarg
            conn.send(("error", f"{type(e).__name__}: {str(e)[:300]}"))


class ChatTemplateRenderer:
    """Render chat templates in a child process that is killed when a rendering takes too long.

    `render()` blocks (call it off the event loop); it is serialized by a lock, as there is one child,
    started by the first chat request (a server that only completes never starts one).
    """

    def __init__(self, model_folder: str, max_chars: int, timeout_s: float = RENDER_TIMEOUT_S) -> None:
        self.model_folder, self.max_chars, self.timeout_s = str(model_folder), max_chars, timeout_s
        self.lock = threading.Lock()
        self.process = self.conn = None
        self.ready = self.closed = False

    def start(self) -> None:
        """Start a child (it loads the tokenizer in the background); render() waits for it to be ready."""
        ctx = multiprocessing.get_context("spawn")
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=_render_worker, args=(child_conn, self.model_folder, self.max_chars),
                                   name="minivllm-chat-template", daemon=True)
        self.process.start()
        child_conn.close()
        self.ready = False

    def _kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.join(timeout=10)
            self.conn.close()
        self.process = self.conn = None

    def render(self, messages: list[dict], chat_template: str | None, **options) -> str:
        """The rendered prompt text; ValueError (a 400) for a template that fails, overruns or times out."""
        with self.lock:
            if self.closed:
                raise RuntimeError("The server is shutting down.")
            if self.process is None or not self.process.is_alive():
                self._kill()
                self.start()
            if not self.ready:
                if not self.conn.poll(READY_TIMEOUT_S):
                    self._kill()
                    raise RuntimeError("The chat template renderer did not start.")
                self.conn.recv()
                self.ready = True
            try:
                self.conn.send((messages, chat_template, options))
                answered = self.conn.poll(self.timeout_s)
                kind, payload = self.conn.recv() if answered else (None, None)
            except (EOFError, OSError):  # the child died (or shutdown() killed it)
                self._kill()
                if self.closed:
                    raise RuntimeError("The server is shutting down.") from None
                raise ValueError("The chat template crashed its renderer: check the template.") from None
            if kind is None:
                self._kill()  # a runaway template: stop it now, a fresh child serves the next request
                raise ValueError(f"The chat template did not finish rendering within {self.timeout_s:g} s: "
                                 f"check it for unbounded loops.")
            if kind == "error":
                raise ValueError(f"The chat template failed to render: {payload}")
            return payload

    def shutdown(self) -> None:
        """Kill the child; a render() waiting on it returns at once (a RuntimeError)."""
        self.closed = True
        process = self.process
        if process is not None:
            process.kill()
        if self.lock.acquire(timeout=10):
            try:
                self._kill()
            finally:
                self.lock.release()
