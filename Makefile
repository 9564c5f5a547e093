# Two commands for a new user: `make demo` and `make test` (see README.md).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
DEMO_ARGS ?= --start 2021-02-10T20:00:00Z --hours 24

.PHONY: demo test bench clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(VENV)/.runtime: requirements.txt | $(PY)
	$(PY) -m pip install -q -r requirements.txt
	touch $@

$(VENV)/.dev: requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install -q -r requirements-dev.txt
	touch $@

# Until the dashboard lands: replay one day of the real Summit trace with the ImageNet job set.
demo: $(VENV)/.runtime
	$(PY) -m core.replay $(DEMO_ARGS)

test: $(VENV)/.dev
	$(PY) -m pytest

bench: $(VENV)/.runtime
	$(PY) -m bench.allocator
	$(PY) -m bench.replay

clean:
	rm -rf $(VENV) .pytest_cache
