# `make run` and `make test` each work on a fresh machine: they create .venv and install first.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LINT_DIRS := $(wildcard app tests bench packaging)
PACKAGING_STAMP := $(VENV)/.packaging-stamp
# llama.cpp as Stoke runs it, from the pinned llama-cpp-python sdist (packaging/llama_build.py):
# the engine's llama-cpp-python with the RPC backend (about 4 minutes on 2 cores), and
# llama-server and rpc-server (`make llama-tools`), each built once per llama-cpp-python
# version and flavor into ~/.cache/stoke-build (STOKE_BUILD_CACHE moves it; CI caches it).
# GPU builds: STOKE_LLAMA_FLAVOR=cuda (or vulkan; metal is the Mac default), and any more
# CMake flags in LLAMA_CMAKE_ARGS.
LLAMA_BUILD := packaging/llama_build.py
# The tests' independent reference for DeepSeek V4 (tests/deepseek_v4_formats.py): mlx-vlm's
# model classes and the formats it writes. Installed without its dependencies (transformers,
# datasets, opencv, mlx-audio, a server: ~415 MB it does not need to build a model); its
# model code needs mlx, numpy and Pillow, which the dev extra brings.
MLX_VLM := mlx-vlm==0.7.10
export CMAKE_BUILD_PARALLEL_LEVEL ?= $(shell nproc 2>/dev/null || echo 2)

.PHONY: run test test-engine test-window lint install clean package package-test llama-tools

$(STAMP): pyproject.toml $(LLAMA_BUILD) Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) $(LLAMA_BUILD) install
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps '$(MLX_VLM)'
	touch $(STAMP)

# llama-server and rpc-server (app/engine/llamacpp/tools.py finds them); `make test` builds
# them so the tests against a real llama-server run.
llama-tools: $(STAMP)
	$(PY) $(LLAMA_BUILD) tools

install: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/stoke $(ARGS)

lint: $(STAMP)
	$(VENV)/bin/ruff check $(LINT_DIRS)
	$(VENV)/bin/ruff format --check $(LINT_DIRS)

# The window's tests run in pytest processes of their own: after the engine tests (hundreds of
# in-process llama.cpp loads) Qt's event loop died by SIGSEGV in a window test, on CI and here,
# never with the window's tests alone. Both parts run on two pytest-xdist workers, a test file
# to each (module fixtures stay shared): most tests wait on an engine child, a server, a
# subprocess or Qt's event loop, so two use the 2-core machine where one left a core idle. A run that
# crashes ends with the test it was in and that thread's frames (tests/crash_log.py). Each
# part's seconds go to build/test-phases.tsv for .ci/run's table.
CRASH_LOG := build/test-crash.log
PHASES := build/test-phases.tsv
TEST_WORKERS ?= 2
# Python keeps its bytecode for the tests' processes: where the shell sets PYTHONDONTWRITEBYTECODE
# (the 2-core box's does), each of the engine tests' stoke, server and engine processes
# compiled the app's sources again, 0.4 s of every `stoke` start there.
PYTEST := env -u PYTHONDONTWRITEBYTECODE STOKE_TEST_CRASH_LOG=$(CRASH_LOG) \
	$(PY) -m pytest -q --durations=20 $(PYTEST_ARGS)
timed = start=$$(date +%s); $(2) || { rc=$$?; $(PY) -m tests.crash_log $(CRASH_LOG); }; \
	echo "$(1)	$$(( $$(date +%s) - start ))	$${rc:-0}" >> $(PHASES); exit $${rc:-0}

test: test-engine test-window

test-engine: $(STAMP) lint llama-tools
	@mkdir -p build && rm -f $(PHASES)
	@$(call timed,tests,$(PYTEST) --ignore=tests/gui -n $(TEST_WORKERS) --dist loadfile)

test-window: $(STAMP)
	@mkdir -p build
	@$(call timed,window tests,$(PYTEST) tests/gui -n $(TEST_WORKERS) --dist loadfile)

$(PACKAGING_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[dev,packaging]'
	touch $(PACKAGING_STAMP)

# The Linux .deb and tarball into dist/ (packaging/README.md); a build of the same version,
# sources and packages is reused from build/package/.
package: $(PACKAGING_STAMP)
	$(PY) packaging/build.py

# The installed .deb's acceptance test; it checks the desktop files with Debian's validators,
# installed here when missing and apt-get can (as root, as CI runs).
package-test: package
	command -v desktop-file-validate >/dev/null && command -v appstreamcli >/dev/null || \
		{ [ "$$(id -u)" = 0 ] && apt-get update -qq && \
		  apt-get install -y -qq desktop-file-utils appstream >/dev/null; } || true
	$(PY) -m pytest -q -m package tests/package $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
