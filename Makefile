# Two commands from a fresh clone: `make demo` and `make test`. Each sets itself up first (scripts/setup_env.py):
# a virtual environment in .venv that also sees an already installed torch (the GPU machine's); when every
# requirement is installed already, airgraph is linked from the checkout without pip (the GPU machine has no
# package registry); otherwise pip installs torch==2.13.0 (the CPU build) only when no torch >= 2.11 is
# importable, then airgraph with its test extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.airgraph-installed
# `make test-fast TORCH=2.15.0`: the fast tests on another supported torch, in an environment of its own
# (TORCH_VENV) that sees .venv's packages and has that torch from the package index (scripts/setup_env.py).
TORCH ?=
TORCH_VENV ?= .venv-torch$(TORCH)
FAST_PY := $(if $(TORCH),$(TORCH_VENV)/bin/python,$(PY))
FAST_STAMP := $(if $(TORCH),$(TORCH_VENV)/.airgraph-installed,$(STAMP))

.PHONY: setup demo test test-fast test-cuda lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup_env.py
	$(PYTHON) scripts/setup_env.py $(VENV)
	touch $(STAMP)

$(TORCH_VENV)/.airgraph-installed: $(STAMP) pyproject.toml scripts/setup_env.py
	$(PY) scripts/setup_env.py --torch $(TORCH) $(TORCH_VENV)
	touch $@

demo: $(STAMP)
	$(VENV)/bin/airgraph demo

# Two workers: the suite is mostly single-threaded Inductor compiles and spawned processes (2 cores: 12m47s
# serial, cold caches). In an order shuffled by SHUFFLE (tests/plugins/shuffle.py), by default a number drawn from
# the commit, so that a test leaking state into later ones fails somewhere; the run prints its seed.
# `make test SHUFFLE=1234` reruns that order, `make test SHUFFLE=` runs the files in order.
SHUFFLE ?= $(shell h=$$(git rev-parse --short=7 HEAD 2>/dev/null) && echo $$((0x$$h)))
test: $(STAMP)
	$(PY) -m pytest -q -n 2 $(if $(SHUFFLE),--shuffle=$(SHUFFLE))

test-fast: $(FAST_STAMP)
	$(FAST_PY) -m pytest -q -n 2 -m "not slow"

test-cuda: $(STAMP)
	$(PY) -m pytest -q -n 4 -m cuda

lint: $(STAMP)
	$(VENV)/bin/ruff check airgraph tests benchmarks
	$(VENV)/bin/ruff format --check airgraph tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/elementwise_chain.py

clean:
	rm -rf $(VENV) .venv-torch* build *.egg-info .pytest_cache
