# The two commands of the README: `make run` and `make test`. Both create .venv and install what they need.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
HOST ?= 127.0.0.1
PORT ?= 8000
ARGS ?=
# Real vLLM (its CPU build) lives in a venv of its own, apart from mmgate's; point VLLM_VENV at an
# existing one to skip the install (e.g. `make test VLLM_VENV=/path/to/vllm-venv`).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
# The stamp is named by the content of the pins and the workaround, so the venv is reinstalled when
# they change and not when a checkout merely touches them.
VLLM_PINS := $(shell cat tools/vllm-requirements.txt tools/patch_torchvision.py | sha256sum | cut -c1-16)
VLLM_STAMP := $(VLLM_VENV)/.mmgate-vllm-$(VLLM_PINS)
# MODEL=tiny (hidden 256, 2 layers, images up to 1,003,520 pixels) or MODEL=micro (hidden 64, 1 layer,
# images capped at 100,352 pixels: the regime of a GPU user, where image handling outweighs prefill).
MODEL ?= tiny
VLLM_MODEL ?= build/$(MODEL)-qwen2vl
REPLICAS ?= 2
export MMGATE_VLLM_VENV := $(abspath $(VLLM_VENV))
export MMGATE_VLLM_MODEL := $(abspath $(VLLM_MODEL))

.PHONY: run test install install-test redis nginx chromium lint typecheck pytest bench clean vllm run-vllm image image-offline

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
	@# the benchmarks package, tests.support and tests.fleet: the repository root on the venv's path (a .pth)
	$(BIN)/python -c "import pathlib, sysconfig; pathlib.Path(sysconfig.get_paths()['purelib'], 'mmgate-dev.pth').write_text('$(CURDIR)\n')"
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test nginx

# vLLM's CPU build, pinned (tools/vllm-requirements.txt), plus the torchvision workaround; once
# (the stamp), again only when the pins or the workaround change.
$(VLLM_STAMP): | $(BIN)/python
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV) || { \
	  echo "make vllm: '$(PYTHON) -m venv $(VLLM_VENV)' failed" >&2; exit 1; }
	@echo "make vllm: installing vLLM's CPU build into $(VLLM_VENV) (once: ~4 min, ~3.5 GB)"
	@$(VLLM_PY) -m pip install -q -r tools/vllm-requirements.txt || { \
	  echo "make vllm: pip could not install tools/vllm-requirements.txt into $(VLLM_VENV) (pip's error above)" >&2; exit 1; }
	@$(VLLM_PY) -m pip uninstall -y -q torchaudio torchcodec
	@$(VLLM_PY) tools/patch_torchvision.py
	@$(VLLM_PY) -c "import vllm, vllm.entrypoints.openai.api_server, torchvision.transforms.v2, soundfile, soxr, av" || { \
	  echo "make vllm: vLLM is installed in $(VLLM_VENV) but does not import (error above)" >&2; exit 1; }
	@rm -f $(VLLM_VENV)/.mmgate-vllm-*
	@touch $@

## vllm: the pinned vLLM venv (audio extra included), the tiny (MODEL=micro: capped micro) Qwen2-VL
## model directory and the tiny Qwen2-Audio one (no download, dummy weights)
vllm: $(VLLM_STAMP)
	@$(VLLM_PY) tools/tiny_qwen2vl.py --out $(VLLM_MODEL) --preset $(MODEL)
	@$(VLLM_PY) tools/tiny_qwen2audio.py --out build/tiny-qwen2audio

## run-vllm: REPLICAS real vLLM replicas on loopback with the gateway in front on $(HOST):$(PORT)
run-vllm: install vllm
	$(BIN)/python tools/run_vllm.py --replicas $(REPLICAS) --host $(HOST) --port $(PORT) -- $(ARGS)

## run: install mmgate and serve the gateway with two embedded engines (sim) on $(HOST):$(PORT)
run: install
	$(BIN)/mmgate serve --host $(HOST) --port $(PORT) $(ARGS)

## image: the container image $(IMAGE) from this checkout (Dockerfile; docs/DEPLOY.md), on BASE_IMAGE
IMAGE ?= mmgate:0.1.0
BASE_IMAGE ?= python:3.11-slim
OFFLINE_BASE_IMAGE ?= mmgate-base:bookworm-py311
image:
	docker build --build-arg BASE_IMAGE=$(BASE_IMAGE) --tag $(IMAGE) .

## image-offline: the same where no registry is reachable: a Debian base image built with debootstrap
## (root), the dependencies' wheels fetched here first (deploy/docker/wheelhouse), no index in the build
image-offline: | $(BIN)/python
	tools/debian_base_image.sh $(OFFLINE_BASE_IMAGE)
	tools/wheelhouse.sh deploy/docker/wheelhouse $(BIN)/python
	docker build --build-arg BASE_IMAGE=$(OFFLINE_BASE_IMAGE) --build-arg PIP_OFFLINE=1 --tag $(IMAGE) .

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

## nginx: Debian's nginx for the nginx-in-front test and benchmark (installed when missing and we are
## root; else the test is skipped, saying so)
nginx:
	@command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx || { \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing nginx from Debian's packages (tests/deploy/test_nginx_front.py)"; \
	    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light >/dev/null; } || \
	      echo "could not install nginx: tests/deploy/test_nginx_front.py will be skipped"; \
	  else \
	    echo "nginx is missing: tests/deploy/test_nginx_front.py will be skipped (Debian: 'sudo apt-get install nginx-light')"; \
	  fi; }

## chromium: headless Chromium for the bench report tests (Debian's package when missing and we are root)
chromium:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing chromium from Debian's packages (bench report tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "chromium is missing: the bench report tests will be skipped (Debian: 'sudo apt-get install chromium')" >&2; \
	  fi; }

lint: install-test
	$(BIN)/ruff check src tests benchmarks tools

typecheck: install-test
	$(BIN)/mypy

pytest: install-test redis chromium vllm
	$(BIN)/python -m pytest -q $(ARGS)

## test: install the test extras, redis-server and vLLM, then ruff, mypy and pytest (real vLLM included)
test: install-test redis chromium vllm lint typecheck pytest

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache build/tiny-qwen2vl build/tiny-qwen2audio
