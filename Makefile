# eerl developer entry points. Every target bootstraps what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
DEPS := pyproject.toml client/pyproject.toml

.PHONY: help setup demo test check-proto proto lint fmt typecheck pytest bench soak clean

help:
	@echo "make demo   - set up and run the simulated RL loop"
	@echo "make test   - set up and run every check (proto, ruff, mypy, pytest)"
	@echo "make proto  - regenerate the gRPC code from proto/"
	@echo "make fmt | lint | bench | soak | clean"

$(STAMP): $(DEPS)
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e './client[e2e]' -e '.[dev]'
	@touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m eerld.livedemo

proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

check-proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py --check

fmt: $(STAMP)
	$(BIN)/ruff format eerld client/eerl tests bench scripts
	$(BIN)/ruff check --fix eerld client/eerl tests bench scripts

lint: $(STAMP)
	$(BIN)/ruff check eerld client/eerl tests bench scripts
	$(BIN)/ruff format --check eerld client/eerl tests bench scripts

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	bash scripts/ensure_prometheus.sh
	$(BIN)/pytest -q

test: check-proto lint typecheck pytest

bench: $(STAMP)
	$(BIN)/python bench/run_all.py

soak: $(STAMP)
	$(BIN)/python bench/soak.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
