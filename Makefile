# eerl developer entry points. Every target bootstraps what it needs.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PIP := $(BIN)/python -m pip
# Exact versions of every runtime dependency and of the build backend (the Dockerfile's too): `make constraints`.
CONSTRAINTS := constraints.txt
DEPS := pyproject.toml client/pyproject.toml sim/pyproject.toml $(CONSTRAINTS)
# Two stamps that compose: the full install (make test, lint, bench, soak…) is a superset of the demo's, so it
# marks both; `make demo` alone installs only eerld, eerl-client, eerl-sim (the simulator, sim/) and matplotlib
# (no torch, TRL, transformers).
STAMP := $(VENV)/.installed
DEMO_STAMP := $(VENV)/.installed-demo
# `make demo-multinode`: the demo's install plus Ray (eerl-client[ray]).
MULTINODE_STAMP := $(VENV)/.installed-demo-multinode
LOCK_VENV := $(or $(TMPDIR),/tmp)/eerl-constraints-venv

.PHONY: help setup demo demo-multinode test check-proto proto options-doc lint fmt typecheck pytest bench soak constraints clean dist image chart

help:
	@echo "make demo   - set up what the demo needs and run the simulated RL loop"
	@echo "make demo-multinode - the same on a local Ray cluster of 4 simulated nodes, one decision per job"
	@echo "make test   - set up everything and run every check (proto, ruff, import contracts, mypy, pytest)"
	@echo "make proto  - regenerate the gRPC code from proto/"
	@echo "make options-doc - rewrite eerld's flags and options in docs/operations.md from eerld/config/options.py"
	@echo "make constraints - re-resolve constraints.txt (the pinned runtime dependencies) in a clean venv"
	@echo "make dist   - sdists and wheels of eerl-client, eerld and eerl-sim in dist/, checked with twine check --strict"
	@echo "make image  - the container image eerld:VERSION (Docker); push it to your own registry"
	@echo "make chart  - lint and render the Helm chart deploy/helm/eerld with the real (pinned) helm"
	@echo "make fmt | lint | bench | soak | clean"

$(BIN)/python:
	@echo "setup: creating $(VENV) with $(PYTHON), upgrading pip"
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip

$(DEMO_STAMP): $(DEPS) | $(BIN)/python
	@echo "setup: installing eerl-client, eerld, eerl-sim and matplotlib at the versions of $(CONSTRAINTS) (about 225 MB)"
	$(PIP) install --constraint $(CONSTRAINTS) -e ./client -e '.[demo]' -e ./sim
	@touch $(DEMO_STAMP)

$(STAMP): $(DEPS) | $(BIN)/python
	@echo "setup: installing everything make test needs: dev tools, eerl-sim with its bench, and torch, TRL and transformers"
	@echo "       for the end-to-end test, and Ray for the multi-node tests (about 2 GB; runtime dependencies at the versions of $(CONSTRAINTS))"
	$(PIP) install --constraint $(CONSTRAINTS) -e './client[e2e,ray]' -e '.[dev]' -e './sim[dev]'
	@touch $(STAMP) $(DEMO_STAMP) $(MULTINODE_STAMP)

$(MULTINODE_STAMP): $(DEPS) | $(BIN)/python
	@echo "setup: installing eerl-client with Ray, eerld, eerl-sim and matplotlib (Ray is about 240 MB more)"
	$(PIP) install --constraint $(CONSTRAINTS) -e './client[ray]' -e '.[demo]' -e ./sim
	@touch $(MULTINODE_STAMP) $(DEMO_STAMP)

setup: $(STAMP)

# The release artifacts: an sdist of each distribution and its wheel built from that sdist (so the sdist is
# complete), with the venv's pinned hatchling (no download), then checked as a package index renders them.
# PROJECT_URLS="Homepage=https://… Source=https://…" adds the project's URLs (none is public yet).
PROJECT_URLS ?=
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python scripts/dist.py --outdir dist $(foreach u,$(PROJECT_URLS),--url $(u))
	$(BIN)/twine check --strict dist/*

# The container image, tagged with the version the wheels carry (needs Docker; push it yourself:
# docker tag eerld:VERSION REGISTRY/eerld:VERSION && docker push REGISTRY/eerld:VERSION).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	docker build --build-arg EERL_VERSION=$(VERSION) -t eerld:$(VERSION) .

# The Helm chart, linted and rendered by the real helm (pinned; scripts/helm.py fetches it once).
chart: $(STAMP)
	$$($(BIN)/python scripts/helm.py) lint deploy/helm/eerld
	$$($(BIN)/python scripts/helm.py) template eerld deploy/helm/eerld --namespace eerl

demo: $(DEMO_STAMP)
	$(BIN)/python -m demo

demo-multinode: $(MULTINODE_STAMP)
	$(BIN)/python -m demo.multinode $(ARGS)

proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

check-proto: $(STAMP)
	$(BIN)/python scripts/gen_protos.py --check

# docs/operations.md's command line and table of options, from the one declaration of each (a test checks it).
options-doc: $(STAMP)
	$(BIN)/python scripts/gen_options_doc.py

# The Python of the repository: the daemon, eerlctl, the client, the simulator, the tests and the tools (demo, benchmarks, soak).
PY_PATHS := eerld eerlctl client/eerl sim/eerl_sim tests demo perf soak scripts

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

# The framework environments build (pip: mostly disk and network), then their tests run, while pytest
# runs on the other core (each local Ray cluster takes ports of its own); each target's output is printed
# whole when it ends.
test: check-proto lint typecheck
	@$(MAKE) --no-print-directory -j2 --output-sync=target pytest test-frameworks

# The hooks against the real framework releases, current and previous minor (tests/frameworks). Their pins
# conflict, so each release gets an environment of its own under $(FW_DIR)/NAME-VERSION: a plain venv with
# only the framework and the small pure-Python modules its imported code needs (--no-deps, listed below),
# and one .pth line that appends the main venv's site-packages (site.addsitedir, so its editable eerl
# installs resolve) for torch, transformers, ray, numpy and eerl itself: nothing heavy is installed twice,
# and what the framework env installs shadows the main venv. OpenRLHF's GPU-only imports (vLLM,
# flash-attn) resolve to the import stand-ins in tests/frameworks/stubs. Left out everywhere: the GPU
# stacks (vllm, sglang, flash-attn, flash-linear-attention, liger-kernel, megatron, cupy,
# transformer-engine), the loggers (wandb, tensorboard) and the data/eval extras (datasets, pandas,
# pyarrow, math-verify), which no module the hooks and tests import loads; the frameworks' own pins of
# torch/transformers/ray (the main venv's are used: see docs/integrations.md).
FW_DIR := .venv-fw
FW_MAIN_SITE = $(shell $(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
FRAMEWORKS := trl-1.16.0 trl-1.15.0 verl-0.9.1 verl-0.8.0 openrlhf-0.11.2 openrlhf-0.10.4 skyrl-0.4.0 skyrl-0.3.0
FW_VERL_DEPS := tensordict==0.10.0 pyvers==0.1.0 cloudpickle omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 hydra-core==1.3.2 \
	codetiming==1.4.0 cachetools fastapi starlette uvicorn opentelemetry-api torchdata==0.11.0 peft==0.21.2
FW_PKGS_trl-1.16.0 := trl==1.16.0
FW_PKGS_trl-1.15.0 := trl==1.15.0
FW_PKGS_verl-0.9.1 := verl==0.9.1 TransferQueue==0.1.10 pyzmq msgspec $(FW_VERL_DEPS)
FW_PKGS_verl-0.8.0 := verl==0.8.0 $(FW_VERL_DEPS)
FW_ORL_DEPS := hjson einops==0.8.2 peft==0.21.2 pylatexenc==2.11 torchdata==0.11.0 py-cpuinfo
FW_PKGS_openrlhf-0.11.2 := openrlhf==0.11.2 deepspeed==0.19.6 $(FW_ORL_DEPS)
FW_PKGS_openrlhf-0.10.4 := openrlhf==0.10.4 deepspeed==0.19.1 $(FW_ORL_DEPS)
# SkyRL (the `skyrl` distribution holds skyrl/train/trainer.py; `skyrl-train` is its older name) declares
# Python >= 3.12; the main venv is 3.11, so it is installed with --ignore-requires-python and one shim line
# (typing.TypedDict -> typing_extensions.TypedDict, which pydantic asks for before 3.12): its modules
# compile on 3.11 and the tests run its real loop (docs/integrations.md).
FW_SKYRL_DEPS := skyrl-gym==0.4.0 jaxtyping==0.3.11 loguru==0.7.3 cloudpathlib==0.26.0 omegaconf==2.4.0 \
	torchdata==0.11.0 pybase64==1.5.1 httpx==0.29.0
FW_PKGS_skyrl-0.4.0 := skyrl==0.4.0 $(FW_SKYRL_DEPS)
FW_PKGS_skyrl-0.3.0 := skyrl==0.3.0 $(FW_SKYRL_DEPS)
# NeMo-RL and slime are not installable from the package index: their tests run in the main venv against
# stand-ins shaped from their source at these commits, whose call sites they check in excerpts cut by
# tests/frameworks/sources/vendor.py (docs/integrations.md). NAME@COMMIT.
FW_SOURCES := nemo_rl@7ea279abfbeb698b092856d0dab61e7cf39bc909 slime@624b824a898ab0ec1fcb4d373004c7f3852bf515

$(FW_DIR)/%/.installed: Makefile | $(STAMP)
	@echo "frameworks: building $(FW_DIR)/$* ($(FW_PKGS_$*), --no-deps, over the main venv)"
	rm -rf $(FW_DIR)/$*
	$(PYTHON) -m venv $(FW_DIR)/$*
	site=$$($(FW_DIR)/$*/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'); \
		echo "import site; site.addsitedir('$(FW_MAIN_SITE)')" > $$site/zz_eerl_main_venv.pth; \
		case $* in openrlhf-*) echo "$(CURDIR)/tests/frameworks/stubs" > $$site/zz_eerl_framework_stubs.pth;; \
		skyrl-*) echo "import typing, typing_extensions; typing.TypedDict = typing_extensions.TypedDict" \
			> $$site/zz_eerl_typeddict_shim.pth;; esac
	$(FW_DIR)/$*/bin/python -m pip install --quiet --disable-pip-version-check --no-deps \
		$(if $(filter skyrl-%,$*),--ignore-requires-python) $(FW_PKGS_$*)
	@touch $@

.PHONY: test-frameworks frameworks-envs clean-frameworks

clean-frameworks:
	rm -rf $(FW_DIR)

frameworks-envs: $(foreach fw,$(FRAMEWORKS),$(FW_DIR)/$(fw)/.installed)

# pytest -m frameworks in each release's environment; EERL_FRAMEWORK selects its test module, and the
# installed version must be the pinned one (tests/frameworks/conftest.py).
test-frameworks: frameworks-envs
	@set -e; for fw in $(FRAMEWORKS); do \
		name=$${fw%-*}; version=$${fw##*-}; \
		$(FW_DIR)/$$fw/bin/python -c 'import sys; from importlib.metadata import version as v; \
			print("== test-frameworks:", sys.argv[1], v(sys.argv[1]), "(torch", v("torch") + ", transformers", \
			v("transformers") + ", ray", v("ray") + ")")' $$name; \
		EERL_FRAMEWORK=$$name EERL_FRAMEWORK_VERSION=$$version \
			$(FW_DIR)/$$fw/bin/python -m pytest -q -p no:cacheprovider -m frameworks tests/frameworks; \
	done; \
	for src in $(FW_SOURCES); do \
		name=$${src%@*}; commit=$${src#*@}; \
		echo "== test-frameworks: $$name source at commit $$commit (not on the package index: stand-ins shaped" \
			"from that source)"; \
		EERL_FRAMEWORK=$$name EERL_FRAMEWORK_COMMIT=$$commit \
			$(BIN)/python -m pytest -q -p no:cacheprovider -m frameworks tests/frameworks; \
	done

bench: $(STAMP)
	$(BIN)/python -m perf

soak: $(STAMP)
	$(BIN)/python -m soak

# A clean resolve of what the image and the demo install (eerld, eerl-client, eerl-sim with its bench extra)
# and of the
# wheel build backend, frozen; keeps the header comment of constraints.txt. Resolve with CPython 3.11, the
# image's Python (PYTHON=python3.11 where python3 is another version).
constraints:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] == (3, 11) else "make constraints: use Python 3.11 (PYTHON=python3.11)")'
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(LOCK_VENV)/bin/python -m pip install --quiet ./client . './sim[bench]' hatchling
	{ grep '^#' $(CONSTRAINTS); $(LOCK_VENV)/bin/python -m pip freeze --exclude eerld --exclude eerl-client \
		--exclude eerl-sim; } \
		> $(CONSTRAINTS).new
	mv $(CONSTRAINTS).new $(CONSTRAINTS)
	rm -rf $(LOCK_VENV)
	@git diff --stat -- $(CONSTRAINTS) 2>/dev/null || true

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
