"""The package's promises: a small public API, ``import eerl`` pulls in only grpcio and protobuf, and its
controller (``eerl.control``) runs without eerld."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import eerl

PUBLIC_API = {
    "DEFAULT_SOCKET_PATH",
    "ClientConfig",
    "ClientError",
    "ClientStats",
    "ConfigError",
    "ExecutionMode",
    "GpuId",
    "GpuRole",
    "Phase",
    "PhaseKind",
    "Session",
    "Workload",
    "__version__",
    "connect",
    "visible_gpus",
}

HEAVY = ["numpy", "torch", "transformers", "trl", "structlog", "eerld", "ray", "verl", "openrlhf"]


def test_the_public_api_is_exactly_the_documented_names() -> None:
    """PUBLIC_API is a deliberate snapshot: changing the API must change this test too."""
    assert set(eerl.__all__) == PUBLIC_API
    assert all(hasattr(eerl, name) for name in PUBLIC_API)


def test_every_public_name_the_package_binds_is_in_all() -> None:
    bound = {
        n for n, v in vars(eerl).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)
    }
    assert bound | {"__version__"} == set(eerl.__all__)


def test_importing_eerl_loads_no_framework_or_heavy_library() -> None:
    code = (
        "import sys, json, eerl, eerl.session;"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(loaded.stdout) == []


def test_the_hooks_import_without_their_frameworks() -> None:
    code = (
        "import sys, json, eerl.integrations.verl, eerl.integrations.openrlhf, eerl.integrations.skyrl,"
        " eerl.integrations.nemo_rl, eerl.integrations.slime;"
        f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(loaded.stdout) == []


def test_the_controller_imports_nothing_from_the_daemon() -> None:
    """eerl.control, the job policy and the shared nouns run in an RL job without eerld installed: loading
    them never loads eerld."""
    modules = "base, budget, curve, eerl, predictor, registry, simple"
    code = (
        f"import sys, json; from eerl.control import {modules};"
        "import eerl.clocks, eerl.gpus, eerl.job.admission, eerl.wire.enums, eerl.wire.limits;"
        "import eerl.wire.metadata;"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'eerld'})))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(loaded.stdout) == []


def test_the_controller_interface_needs_no_numpy() -> None:
    """The protocol, the clock grid and the fixed/off controllers load without the [control] extra."""
    code = (
        "import sys, json; from eerl.control import base, simple; import eerl.clocks;"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & {'numpy'})))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(loaded.stdout) == []
