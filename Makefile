# The two commands of the README: `make run` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=

.PHONY: run test install install-test redis lint typecheck pytest bench clean

# Debian's own python3 needs python3-venv for `-m venv`: installed when missing and we are root.
$(BIN)/python:
	@$(PYTHON) -m venv $(VENV) 2>/dev/null || { rm -rf $(VENV); \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing python3-venv from Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv >/dev/null && \
	    $(PYTHON) -m venv $(VENV); \
	  else \
	    echo "'$(PYTHON) -m venv' failed: install python3-venv (Debian: 'sudo apt-get install python3-venv')" >&2; exit 1; \
	  fi; }
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e .
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

## run: install mmgate and serve the gateway with two embedded engines (sim) on $(HOST):$(PORT)
run: install
	$(BIN)/mmgate serve --host $(HOST) --port $(PORT) $(ARGS)

## redis: make sure a real redis-server is on PATH (Debian's package when missing and we are root)
redis:
	@command -v redis-server >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing redis-server from Debian's packages"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; \
	  else \
	    echo "redis-server is missing: install it (Debian: 'sudo apt-get install redis-server') and rerun 'make test'" >&2; exit 1; \
	  fi; }
	@redis-server --version

lint: install-test
	$(BIN)/ruff check src tests benchmarks

typecheck: install-test
	$(BIN)/mypy

pytest: install-test redis
	$(BIN)/python -m pytest -q $(ARGS)

## test: install the test extras and redis-server, then ruff, mypy and pytest
test: install-test redis lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
