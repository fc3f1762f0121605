"""The way in: the README, `make help`, `--help`, the performance page's tables, and the documentation site.

The site is built once per session with mkdocs in strict mode (the `docs` extra; without it the site tests skip,
naming the install, and under CI=true they fail: `make test` installs it), served on 127.0.0.1, and every page
opened in Debian's headless chromium (as tests/test_viewer.py drives it). A page fails on a console error or an
image that does not load; every internal link and anchor of every page must resolve; no page may load anything
from another host. On the viewer's page `#step=N` opens step N; a notebook page shows its stored outputs.
"""
from __future__ import annotations

import functools
import html.parser
import http.server
import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from pathlib import Path

import pytest

from conftest import CHROMEDRIVER, CHROMIUM, quit_chromium, start_chromium

ROOT = Path(__file__).resolve().parents[1]
ARTICLE = ("https://dev.to/yuan_lei_e631e36865ed370b/"
           "inside-vllm-following-one-request-from-the-api-to-gpu-execution-1ja6")
ZHIHU = "https://zhuanlan.zhihu.com/p/2060033883849204419"
DOCS_INSTALL = "make setup-docs (pip install -e '.[docs]')"


# ---- the README, make help, --help: no build needed -------------------------------------------------------

def test_readme_is_short_links_the_article_and_has_no_dated_entry():
    readme = (ROOT / "README.md").read_text()
    lines = readme.splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; reference text belongs on the docs site"
    assert ARTICLE in readme and ZHIHU in readme, "the README must link the article (dev.to) and the Zhihu original"
    dated = [line for line in lines if line.startswith("#") and re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
    assert not dated, f"dated headings (a benchmark diary) in the README: {dated}"
    for page in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / page).exists(), f"README links {page}, which does not exist"


def test_make_help_lists_every_documented_target():
    makefile = (ROOT / "Makefile").read_text()
    targets = re.findall(r"^([a-z][a-z-]*):[^=\n]*##", makefile, re.M)
    assert "trace-serve" in targets and "docs" in targets and "perf-report" in targets
    out = subprocess.run(["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    listed = {line.split()[0] for line in out.splitlines() if line.strip()}
    assert set(targets) <= listed, f"make help leaves out {sorted(set(targets) - listed)}"
    test_line = next(line for line in out.splitlines() if line.startswith("test "))
    assert "minutes" in test_line, f"make help should say how long `make test` takes: {test_line!r}"


def test_every_subcommand_has_an_example_in_the_top_level_help(capsys):
    from minivllm.__main__ import main
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    for sub in ("trace", "generate", "serve", "trace-serve"):
        assert re.search(rf"^\s+python -m minivllm {sub}\b", out, re.M), f"no example of `{sub}` in --help"


# ---- the performance page: generated from benchmarks/results/ ---------------------------------------------

def _report():
    spec = importlib.util.spec_from_file_location("perf_report", ROOT / "benchmarks" / "report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_performance_tables_regenerate_byte_for_byte_from_the_results():
    report = _report()
    page = (ROOT / "docs" / "performance.md").read_text()
    assert report.splice(page, report.generate()) == page, "docs/performance.md is stale: run `make perf-report`"
    assert report.generate() == report.generate()


def test_a_saved_result_reaches_the_report(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import results
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    import argparse
    parser = argparse.ArgumentParser()
    results.add_arguments(parser)
    args = parser.parse_args(["--results", str(tmp_path), "--note", "a shared machine"])
    path = results.save(args, "throughput", "throughput.py", [{"round": 1, "minivllm s": 1.25}],
                        {"minivllm best tok/s": 123.456}, argv=["--rounds", "1"])
    doc = json.loads(path.read_text())
    assert doc["command"] == "python benchmarks/throughput.py --rounds 1"
    assert {"cpu", "flags", "usable_cpus"} <= set(doc["machine"]) and "torch" in doc["versions"]
    text = _report().generate(tmp_path)
    assert "| round | minivllm s |" in text and "| 1 | 1.25 |" in text
    assert "| minivllm best tok/s | 123.5 |" in text and "a shared machine" in text
    assert doc["command"] in text


# ---- the site, built once, opened in a browser ------------------------------------------------------------

def _need(condition: bool, reason: str) -> None:
    if not condition:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{reason} (under CI `make test` installs it)")
        pytest.skip(reason)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    _need(importlib.util.find_spec("mkdocs") is not None and importlib.util.find_spec("mkdocs_jupyter") is not None,
          f"the docs extra is not installed: {DOCS_INSTALL}")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # mkdocs-material's end-of-life banner, not a build warning
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=1500, env=env)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{log[-6000:]}"
    assert not re.search(r"^WARNING\b", log, re.M), f"the build warned:\n{log[-6000:]}"
    return out


@pytest.fixture(scope="module")
def base_url(site):
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    handler = functools.partial(Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser():
    try:
        from selenium import webdriver
    except ImportError:
        webdriver = None
    _need(webdriver is not None and CHROMIUM.exists() and CHROMEDRIVER.exists(),
          "no headless browser: apt-get install -y chromium chromium-driver (make setup-browser) and selenium")
    driver = start_chromium("1400,1200", page_load_timeout=60)
    try:
        yield driver
    finally:
        quit_chromium(driver)


class _Refs(html.parser.HTMLParser):
    """Every reference a page makes (href, src) and every id / name it defines."""

    def __init__(self):
        super().__init__()
        self.refs: list[tuple[str, str]] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for key in ("id", "name"):
            if a.get(key):
                self.ids.add(a[key])
        for key in ("href", "src"):
            if a.get(key) is not None:
                self.refs.append((tag, a[key]))


@functools.lru_cache(maxsize=None)
def _parse(path: Path) -> _Refs:
    parser = _Refs()
    parser.feed(path.read_text(errors="replace"))
    return parser


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html")


def test_the_site_has_every_page(site):
    names = {p.relative_to(site).as_posix() for p in _pages(site)}
    expected = {"index.html", "reading-guide.html", "trace.html", "engine-args.html", "server.html",
                "tensor-parallel.html", "spec-decode.html", "envs.html", "failures.html", "gpu.html",
                "labs/students.html", "labs/instructors.html", "performance.html", "reading-vllm.html",
                "traces/default.html", "traces/chunked.html", "traces/preemption.html", "traces/prefix.html",
                "traces/spec.html"}
    expected |= {f"notebooks/{p.stem}.html" for p in (ROOT / "notebooks").glob("0*.ipynb")}
    assert expected <= names, f"missing pages: {sorted(expected - names)}"


def test_every_internal_link_and_anchor_resolves_and_nothing_loads_from_another_host(site):
    broken, external = [], []
    for page in _pages(site):
        for tag, ref in _parse(page).refs:
            url = urllib.parse.urlparse(ref)
            if url.scheme in ("mailto", "data", "javascript"):
                continue
            if url.scheme in ("http", "https") or ref.startswith("//"):  # another host: fine to link, not to load
                if tag in ("script", "img", "iframe", "link", "source", "video", "audio"):
                    external.append(f"{page.relative_to(site)}: <{tag}> {ref}")
                continue
            target = (page.parent / urllib.parse.unquote(url.path)).resolve() if url.path else page
            if target.is_dir():
                target = target / "index.html"
            if not target.exists():
                broken.append(f"{page.relative_to(site)}: {ref}")
            elif url.fragment and target.suffix == ".html" and not url.fragment.startswith("step="):
                if url.fragment not in _parse(target).ids:
                    broken.append(f"{page.relative_to(site)}: {ref} (no such anchor)")
    assert not broken, "broken internal links:\n" + "\n".join(broken[:40])
    assert not external, "pages load from another host (the site must work offline):\n" + "\n".join(external[:40])


def _console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


BROKEN_IMAGES = "return [...document.images].filter((i) => !i.complete || i.naturalWidth === 0).map((i) => i.src);"


def test_every_page_opens_without_a_console_error_or_a_broken_image(site, base_url, browser):
    failures = []
    for page in _pages(site):
        rel = page.relative_to(site).as_posix()
        browser.get(base_url + rel)
        browser.execute_script("window.scrollTo(0, document.body.scrollHeight);")  # lazy images, if any
        errors = _console_errors(browser)
        images = browser.execute_script(BROKEN_IMAGES)
        if errors or images:
            failures.append(f"{rel}: console {errors}, images not loaded {images}")
    assert not failures, "\n".join(failures)


def test_the_viewer_opens_the_step_its_address_names(base_url, browser):
    browser.get(base_url + "traces/preemption.html#step=3")
    assert browser.execute_script("return document.body.dataset.step;") == "3"
    browser.get(base_url + "trace.html")
    frame = browser.find_element("id", "viewer-frame")
    assert frame.get_attribute("src").endswith("traces/preemption.html#step=6")
    browser.switch_to.frame(frame)
    try:
        assert browser.execute_script("return document.body.dataset.step;") == "6"
        assert "6" in browser.execute_script("return document.getElementById('step-label').textContent;")
    finally:
        browser.switch_to.default_content()
    assert not _console_errors(browser)


def test_a_notebook_page_shows_its_stored_outputs(base_url, browser):
    browser.get(base_url + "notebooks/03_input_packing.html")
    nav = browser.execute_script("return [...document.querySelectorAll('.md-nav__link')].map((a) => a.textContent);")
    assert any("3 Input packing" in text for text in nav), "notebook pages take their titles from mkdocs.yml's nav"
    outputs = browser.execute_script(
        "return [...document.querySelectorAll('.jp-OutputArea')].map((o) => o.textContent);")
    assert any("slot_mapping" in text for text in outputs), "no stored output of notebook 03 shows slot_mapping"
    assert not _console_errors(browser)
