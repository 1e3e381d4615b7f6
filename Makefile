# Two entry points: `make run` (the main job) and `make test` (lint + tests). Both set up .venv first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; override for CUDA machines, e.g. `make TORCH_SPEC=torch run`.
TORCH_SPEC ?= torch==2.13.0
RUN_ARGS ?= --model tiny --chunks 8 --seed 0 --out runs/replay.json --video runs/replay.mp4
PYTEST_ARGS ?=

.PHONY: setup run test lint clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

run: setup
	$(PY) -m benchmarks.replay $(RUN_ARGS)

lint: setup
	$(PY) -m ruff check .

test: lint
	$(PY) -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
