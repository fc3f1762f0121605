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
`prepare_chat_render` is the one code path, for LLM.chat and the server alike, from messages and options
to what is rendered (`parse_chat_messages`: {"role", "content"} strings; the template and its kwargs, the
checks); `apply_hf_chat_template` renders it (LLM.chat in-process: its caller is trusted).
Left out: vLLM's content-format detection, multimodal parts, tool definitions in the template.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import threading

RENDER_TIMEOUT_S = 10.0  # one rendering, from the request's arrival at the child to its answer
READY_TIMEOUT_S = 120.0  # the child loading the tokenizer (2 shared cores, a cold disk)
MEMORY_HEADROOM = 1 << 30  # address space the child may add to what it holds once ready


RESERVED_KWARGS = ("conversation", "messages", "tokenize")  # apply_chat_template arguments minivllm sets


@dataclasses.dataclass
class ChatRenderRequest:
    """What to render: the conversation, the template (None: the tokenizer's) and apply_chat_template's options."""
    conversation: list[dict[str, str]]
    chat_template: str | None
    options: dict


def short_repr(value, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def parse_chat_messages(messages) -> list[dict[str, str]]:
    """Messages (dicts or the server's ChatMessage) as {"role", "content"} strings; text parts are joined.

    E.g. [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}] -> [{"role": "user", "content": "Hi"}].
    """
    if not isinstance(messages, (list, tuple)):
        raise ValueError(f"A conversation must be a list of message dicts like {{'role': 'user', 'content': "
                         f"'Hello'}}, got {type(messages).__name__}.")
    if not messages:
        raise ValueError("messages is empty: send at least one {'role': 'user', 'content': 'Hello'} message.")
    conversation = []
    for i, message in enumerate(messages):
        if isinstance(message, dict):
            if "content" not in message:
                raise ValueError(f"messages[{i}] needs a 'content': a message is {{'role': 'user', 'content': "
                                 f"'Hello'}}, got {short_repr(message)}.")
            role, content = message.get("role"), message["content"]
        elif hasattr(message, "role"):
            role, content = message.role, getattr(message, "content", None)
        else:
            raise ValueError(f"messages[{i}] must be a dict like {{'role': 'user', 'content': 'Hello'}}, got "
                             f"{type(message).__name__}.")
        if not isinstance(role, str):
            raise ValueError(f"messages[{i}] needs a string 'role': a message is {{'role': 'user', 'content': "
                             f"'Hello'}}.")
        if isinstance(content, list):
            if any(not isinstance(part, dict) or part.get("type") != "text" for part in content):
                raise ValueError(f"messages[{i}].content: only 'text' parts are supported (no images or audio).")
            content = "\n".join(str(part.get("text", "")) for part in content)
        elif content is not None and not isinstance(content, str):
            raise ValueError(f"messages[{i}].content must be a string or a list of text parts, got "
                             f"{type(content).__name__}.")
        conversation.append({"role": role, "content": content or ""})
    return conversation


def prepare_chat_render(messages, *, tokenizer_template: str | None, chat_template: str | None = None,
                        add_generation_prompt: bool = True, continue_final_message: bool = False,
                        chat_template_kwargs: dict | None = None,
                        trust_chat_template: bool = True) -> ChatRenderRequest:
    """The one code path from a chat request (LLM.chat or /v1/chat/completions) to what the template renders.

    `chat_template_kwargs` go to the template (and may set add_generation_prompt, continue_final_message
    or chat_template, as in vLLM); a template the caller sends is refused unless `trust_chat_template`
    (the server's --trust-request-chat-template; LLM's caller is trusted). Bad options: a ValueError.
    """
    kwargs = dict(chat_template_kwargs or {})
    if chat_template is None:
        chat_template = kwargs.get("chat_template")
    bad = sorted(k for k in kwargs if not isinstance(k, str) or k in RESERVED_KWARGS)
    if bad:
        raise ValueError(f"chat_template_kwargs may not set {bad}: they are set by minivllm.")
    kwargs.pop("chat_template", None)
    options = {"add_generation_prompt": add_generation_prompt, "continue_final_message": continue_final_message,
               **kwargs}
    if chat_template is not None and not trust_chat_template:
        raise ValueError("Chat template is passed with request, but --trust-request-chat-template is not set. "
                         "Refused request with untrusted chat template.")  # vLLM's message
    if chat_template is None and tokenizer_template is None:
        raise ValueError("This model's tokenizer has no chat template: pass chat_template, or send plain prompts "
                         "(LLM.generate, /v1/completions).")
    if options["add_generation_prompt"] and options["continue_final_message"]:
        raise ValueError("continue_final_message=True extends the last message, add_generation_prompt=True "
                         "starts a new one: set add_generation_prompt=False.")
    return ChatRenderRequest(parse_chat_messages(messages), chat_template, options)


def apply_hf_chat_template(tokenizer, render: ChatRenderRequest) -> str:
    """vLLM's name: the rendered prompt text (in-process for LLM.chat, in the bounded child for the server)."""
    text = tokenizer.apply_chat_template(render.conversation, chat_template=render.chat_template, tokenize=False,
                                         **render.options)
    if not isinstance(text, str):
        raise TypeError(f"the template rendered a {type(text).__name__}, not text")
    return text


def _render_worker(conn, model_folder: str, max_chars: int) -> None:
    """The child: load the tokenizer once, then render each ChatRenderRequest it is sent."""
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
            render = conn.recv()
        except (EOFError, OSError):
            return
        try:
            text = apply_hf_chat_template(tokenizer, render)
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

    def render(self, render: ChatRenderRequest) -> str:
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
                self.conn.send(render)
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
