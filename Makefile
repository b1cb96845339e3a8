# eerl developer entry points. Every target bootstraps what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Exact versions of every runtime dependency and of the build backend (the Dockerfile's too): `make constraints`.
CONSTRAINTS := constraints.txt
DEPS := pyproject.toml client/pyproject.toml $(CONSTRAINTS)
# Two stamps that compose: the full install (make test, lint, bench, soak…) is a superset of the demo's, so it
# marks both; `make demo` alone installs only eerld, eerl-client and matplotlib (no torch, TRL, transformers).
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# `make demo-multinode`: the demo's install plus Ray (eerl-client[ray]).
MULTINODE_STAMP := $(VENV)/.installed-demo-multinode
LOCK_VENV := $(or $(TMPDIR),/tmp)/eerl-constraints-venv

.PHONY: help setup demo demo-multinode test check-proto proto lint fmt typecheck pytest bench soak constraints clean

help:
	@echo "make demo   - set up what the demo needs and run the simulated RL loop"
	@echo "make demo-multinode - the same on a local Ray cluster of 4 simulated nodes, one decision per job"
	@echo "make test   - set up everything and run every check (proto, ruff, import contracts, mypy, pytest)"
	@echo "make proto  - regenerate the gRPC code from proto/"
	@echo "make constraints - re-resolve constraints.txt (the pinned runtime dependencies) in a clean venv"
	@echo "make fmt | lint | bench | soak | clean"

$(BIN)/python:
	@echo "setup: creating $(VENV) with $(PYTHON), upgrading pip"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(DEMO_STAMP): $(DEPS) | $(BIN)/python
	@echo "setup: installing eerl-client, eerld and matplotlib at the versions of $(CONSTRAINTS) (about 225 MB)"
	$(PIP) install --constraint $(CONSTRAINTS) -e ./client -e '.[demo]'
	@touch $(DEMO_STAMP)

$(STAMP): $(DEPS) | $(BIN)/python
	@echo "setup: installing everything make test needs: dev tools, bench, and torch, TRL and transformers"
	@echo "       for the end-to-end test, and Ray for the multi-node tests (about 2 GB; runtime dependencies at the versions of $(CONSTRAINTS))"
	$(PIP) install --constraint $(CONSTRAINTS) -e './client[e2e,ray]' -e '.[dev]'
	@touch $(STAMP) $(DEMO_STAMP) $(MULTINODE_STAMP)

$(MULTINODE_STAMP): $(DEPS) | $(BIN)/python
	@echo "setup: installing eerl-client with Ray, eerld and matplotlib (Ray is about 240 MB more)"
	$(PIP) install --constraint $(CONSTRAINTS) -e './client[ray]' -e '.[demo]'
	@touch $(MULTINODE_STAMP) $(DEMO_STAMP)

setup: $(STAMP)

demo: $(DEMO_STAMP)
	$(BIN)/python -m demo

demo-multinode: $(MULTINODE_STAMP)
	$(BIN)/python -m demo.multinode $(ARGS)

proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

check-proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py --check

# The Python of the repository: the daemon, the client, the tests and the tools (demo, benchmarks, soak).
PY_PATHS := eerld client/eerl tests demo perf soak scripts

fmt: $(STAMP)
	$(BIN)/ruff format $(PY_PATHS)
	$(BIN)/ruff check --fix $(PY_PATHS)

lint: $(STAMP)
	$(BIN)/ruff check $(PY_PATHS)
	$(BIN)/ruff format --check $(PY_PATHS)
	$(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	bash scripts/ensure_prometheus.sh
	$(BIN)/pytest -q

test: check-proto lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python -m perf

soak: $(STAMP)
	$(BIN)/python -m soak

# A clean resolve of what the image and the demo install (eerld, eerl-client, the bench extra) and of the
# wheel build backend, frozen; keeps the header comment of constraints.txt. Resolve with CPython 3.11, the
# image's Python (PYTHON=python3.11 where python3 is another version).
constraints:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "make constraints: use Python 3.11 (PYTHON=python3.11)")'
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet ./client '.[bench]' hatchling
	{ grep '^#' $(CONSTRAINTS); $(LOCK_VENV)/bin/python -m pip freeze --exclude eerld --exclude eerl-client; } \
		> $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)
	@git diff --stat -- $(CONSTRAINTS) 2>/dev/null || true

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
