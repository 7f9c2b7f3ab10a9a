# Two commands from a fresh clone: `make demo` and `make test`. Each sets itself up first:
# a virtual environment in .venv that also sees an already installed torch (the GPU machine's),
# torch==2.13.0 (the CPU build) only when no torch >= 2.11 is importable, then airgraph with its test extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.airgraph-installed

.PHONY: setup demo test test-fast test-cuda lint bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv --system-site-packages $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@if $(PY) -c "import torch" 2>/dev/null; then \
		$(PY) -c "import sys, torch; v = tuple(int(p) for p in torch.__version__.split('+')[0].split('.')[:2]); \
sys.exit(0 if v >= (2, 11) else 'airgraph needs torch >= 2.11; found ' + torch.__version__)"; \
	else \
		$(PY) -m pip install -q torch==2.13.0; \
	fi
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/airgraph demo

# Two workers: the suite is mostly single-threaded Inductor compiles and spawned processes (2 cores: 12m47s
# serial, cold caches).
test: $(STAMP)
	$(PY) -m pytest -q -n 2

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

test-cuda: $(STAMP)
	$(PY) -m pytest -q -m cuda

lint: $(STAMP)
	$(VENV)/bin/ruff check airgraph tests benchmarks
	$(VENV)/bin/ruff format --check airgraph tests benchmarks

bench: $(STAMP)
	$(PY) benchmarks/elementwise_chain.py

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
