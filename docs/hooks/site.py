"""mkdocs hooks for the documentation site (mkdocs.yml names this file under `hooks:`).

- After the build, the trace viewer's recorded runs are made from the real engine
  (`python -m minivllm trace --html`, the five runs of `make trace`'s examples) into site/traces/, which the
  "Trace and viewer" page embeds. They are cached under .cache/docs-traces/, keyed by the engine's sources
  and the flags, so a rebuild (`make docs-serve`) does not rerun the engine unless the code changed.
- Notebook pages (mkdocs-jupyter) are rendered from their stored outputs; the MathJax script nbconvert's
  template loads from a CDN is dropped, so no page asks the network for anything; and the table of contents
  points at the headings' own ids (mkdocs-jupyter drops code spans from its anchors, nbconvert keeps them).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "docs-traces"
SHARED_PREFIX = "You are a helpful assistant who answers in short, plain sentences. "
# name -> `python -m minivllm trace` flags: the runs `make trace` documents (as tests/test_viewer.py traces them)
TRACES = {
    "default": [],
    "chunked": ["--max-num-batched-tokens", "3"],
    "preemption": ["--num-blocks", "6", "--block-size", "8"],
    "prefix": ["--shared-prefix", SHARED_PREFIX, "--block-size", "8"],
    "spec": ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": 4,
                                                 "prompt_lookup_max": 4, "prompt_lookup_min": 1}),
             "--prompt", "Copy this list exactly: apples, pears, plums, figs, dates, limes. Copy: apples, pears,",
             "--max-tokens", "16", "--neighbours", "1"],
}
# nbconvert's MathJax loader: a CDN address, or an empty src when no address is configured
_HEADING_ID = re.compile(r'<h[1-6][^>]*\bid="([^"]+)"')
_MATHJAX = re.compile(r'<script[^>]*src="(https?://[^"]*mathjax[^"]*)?"[^>]*>\s*</script>', re.I)


def _engine_key() -> str:
    """A digest of everything that shapes a trace: the engine's sources, the viewer, the flags."""
    h = hashlib.sha256(json.dumps(TRACES, sort_keys=True).encode())
    for path in sorted((ROOT / "minivllm").rglob("*")):
        if path.suffix in (".py", ".js", ".css", ".html", ".c", ".h") and "__pycache__" not in path.parts:
            h.update(str(path.relative_to(ROOT)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _make_trace(name: str, out: Path) -> None:
    cmd = [sys.executable, "-m", "minivllm", "trace", "--in-process", "--width", "100", "--html", str(out),
           *TRACES[name]]
    env = {**os.environ, "MINIVLLM_LOGGING_LEVEL": "WARNING"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"trace {name!r} failed ({proc.returncode}): {' '.join(cmd)}\n{proc.stderr[-3000:]}")


def on_post_build(config, **kwargs) -> None:
    """Write site/traces/<name>.html for every recorded run (from the cache when the engine is unchanged)."""
    folder = CACHE / _engine_key()
    missing = [name for name in TRACES if not (folder / f"{name}.html").exists()]
    if missing:
        folder.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=2) as pool:
            list(pool.map(lambda n: _make_trace(n, folder / f"{n}.html"), missing))
        for old in CACHE.iterdir():  # keep only the current engine's traces
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)
    dest = Path(config["site_dir"]) / "traces"
    dest.mkdir(parents=True, exist_ok=True)
    for name in TRACES:
        shutil.copyfile(folder / f"{name}.html", dest / f"{name}.html")


def on_post_page(output: str, page, config) -> str:
    """Drop nbconvert's MathJax script from notebook pages (no notebook here uses LaTeX)."""
    if page.file.src_uri.endswith(".ipynb"):
        output = _MATHJAX.sub("", output)
    return output


def on_page_context(context, page, config, nav):
    """Point a notebook page's table of contents at its headings' ids, entry by entry in document order."""
    if page.file.src_uri.endswith(".ipynb") and page.content:
        ids = _HEADING_ID.findall(page.content)
        entries, stack = [], list(reversed(list(page.toc)))
        while stack:
            item = stack.pop()
            entries.append(item)
            stack.extend(reversed(list(item.children)))
        if len(entries) == len(ids):
            for item, heading_id in zip(entries, ids):
                item.id = heading_id
    return context
