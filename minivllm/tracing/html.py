"""`python -m minivllm trace --html FILE`: the whole trace as one self-contained HTML viewer.

Mirrors nothing in vLLM (vLLM has no trace viewer); it is this repository's way to watch the real
engine's recorded steps in a browser. The file holds the same trace `--json` writes, embedded as JSON,
plus the viewer's JavaScript and CSS inline (package data in `viewer/`): no network, no CDN, it opens
from disk. The viewer draws only what the engine recorded, or what it counts from recorded values.

Beside the trace it embeds three fields of the engine's own config that the trace does not carry and
the token-budget panel needs (max_num_batched_tokens, max_num_seqs, enable_prefix_caching); the budget as
EngineCore resolved it (its info), since the config leaves it None when chunked prefill is off.
The live page of `minivllm serve` (GET /trace, entrypoints/openai/trace_page.py) is the same page with an empty trace
and `"live"` naming its event stream: the viewer then appends the steps as they arrive.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path


# Concatenated in this order into one <script>: the model, then the panels, then the header and the navigation.
SCRIPTS = ("aliases.js", "model.js", "panels.js", "overlap.js", "panels2.js", "panels3.js", "header.js",
           "viewer.js")
CONFIG_FIELDS = ("max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching")


def _asset(name: str) -> str:
    return resources.files("minivllm.tracing").joinpath("viewer", name).read_text(encoding="utf-8")


def render_html(trace, config=None, live: str | None = None) -> str:
    """The viewer page for `trace` (a trace.Trace; not imported here, since Trace.write_html calls
    this module); `config` is the engine's config (its CONFIG_FIELDS are embedded);
    `live`: the URL of a /trace/events stream the page follows (minivllm serve's /trace).

    The JSON sits in a <script type="application/json">; "</" is written "<\\/" so that a prompt
    containing "</script>" cannot end the block early (JSON reads "<\\/" back as "</").
    """
    engine_config = {k: getattr(config, k) for k in CONFIG_FIELDS if hasattr(config, k)}
    if trace.info.get("max_num_batched_tokens") is not None:  # traces written before it was in info lack it
        engine_config["max_num_batched_tokens"] = trace.info["max_num_batched_tokens"]
    payload = {"trace": {"info": trace.info, "caller_pid": trace.caller_pid, "events": trace.events},
               "config": engine_config, **({"live": live} if live else {})}
    data = json.dumps(payload).replace("</", "<\\/")
    page = _asset("template.html")
    for marker, text in (("/*__CSS__*/", _asset("viewer.css")),
                         ("/*__JS__*/", "\n".join(_asset(name) for name in SCRIPTS)),
                         ("/*__TRACE__*/", data)):
        before, sep, after = page.partition(marker)
        if not sep:
            raise ValueError(f"viewer/template.html lacks its {marker} marker")
        page = before + text + after  # partition, not replace: the inserted text is never searched again
    return page


def write_html(trace, path: str | Path, config=None) -> None:
    """Write the viewer for `trace` to `path` (one file; open it in a browser, append #step=N for a step)."""
    Path(path).write_text(render_html(trace, config), encoding="utf-8")
