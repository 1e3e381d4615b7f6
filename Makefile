# Two entry points: `make run` (the main job) and `make test` (lint + tests). Both set up .venv first.
# `make test-fast` is the tier that runs in under a minute; `make lint` is ruff, its formatter and mypy.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# The CPU build of torch; override for CUDA machines, e.g. `make TORCH_SPEC=torch run`.
TORCH_SPEC ?= torch==2.13.0
# `make run MODEL=gridworld-responsive`: another preset (default: the server's, gridworld).
MODEL ?=
RUN_ARGS ?= --placement cpu
REPLAY_ARGS ?= --chunks 8 --seed 0 --out runs/replay.json --video runs/replay.mp4
PYTEST_ARGS ?=
# The fast tier: no spawned process, no training, no browser, no model run of a second or more
# (markers in pyproject.toml).
FAST_MARKERS := not (processes or training or browser or heavy or long or gpu or slow or container or parity)

# The parity suite's reference implementations (tests/parity/requirements.txt), test-only.
PARITY_SITE ?= .parity

.PHONY: setup run replay test test-long test-fast test-parity test-container lint packages parity-deps clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet "$(TORCH_SPEC)"
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# The server with the embedded default model; prints the URL to open once it is warm.
run: setup
	$(VENV)/bin/worldrtc serve $(MODEL) $(RUN_ARGS)

# Headless: generate a video from the default control trace (runs/replay.mp4).
replay: setup
	$(VENV)/bin/worldrtc replay $(REPLAY_ARGS)

# FastVideo, transformers and diffusers, pinned and without their dependency lists, into a folder
# of their own that only the parity tests put on their path (about 390 MB, half a minute).
parity-deps: $(PARITY_SITE)/.installed

$(PARITY_SITE)/.installed: tests/parity/requirements.txt | setup
	rm -rf $(PARITY_SITE)
	$(PY) -m pip install --quiet --no-deps --target $(PARITY_SITE) -r tests/parity/requirements.txt
	touch $@

# Debian packages that tests start on loopback: Chromium (the real-browser test), coturn (TURN relay)
# and HAProxy (nodes behind a balancer), as package:command pairs. Installing needs root (CI runs as
# root); without it the tests that need a missing one are skipped with a message.
DEB_PACKAGES := chromium:chromium coturn:turnserver haproxy:haproxy

packages:
	@missing=""; for pair in $(DEB_PACKAGES); do \
	  command -v "$${pair#*:}" >/dev/null 2>&1 || PATH="$$PATH:/usr/sbin" command -v "$${pair#*:}" >/dev/null 2>&1 \
	    || missing="$$missing $${pair%%:*}"; \
	done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "note:$$missing not installed (sudo make packages); the tests that need them will be skipped"; fi; \
	fi

# The same checks as .pre-commit-config.yaml: lint, format, types (strict on the server, runtime and
# wire) and the import layers (no cycles, no torch in the wire contract).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

# The default suite (under 15 minutes on two cores); it ends with its 20 slowest tests, which is
# where to look when it grows. Tests of 11 s or more are `long` (make test-long, which CI runs after
# this); soaks marked `slow` run only on purpose: `pytest -m slow`.
test: lint packages parity-deps
	$(PY) -m pytest -m "not (long or slow or container)" --durations=20 $(PYTEST_ARGS)

# Tests of 11 s or more: streams, reliability rows at their short size, rehearsals (about 20 minutes).
test-long: packages parity-deps
	$(PY) -m pytest -m "long and not (slow or container)" --durations=10 $(PYTEST_ARGS)

# The model code against independent implementations (docs/correctness.md).
test-parity: parity-deps
	$(PY) -m pytest -m parity $(PYTEST_ARGS)

# The container image built (from a Debian base made with debootstrap), run and streamed from: root,
# podman, runc and debootstrap (installed here when missing), several minutes.
test-container: setup
	@command -v podman >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends podman buildah runc debootstrap uidmap; }
	$(PY) -m pytest -m container $(PYTEST_ARGS)

# Seconds, not minutes: every test that starts no process, trains nothing, needs no browser and
# builds, loads or runs no model for half a second or more.
test-fast: lint
	$(PY) -m pytest -m "$(FAST_MARKERS)" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(PARITY_SITE) runs .pytest_cache .ruff_cache
