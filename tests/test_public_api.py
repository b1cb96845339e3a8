"""The public surface of each package that declares ``__all__`` (after httpx's test_exported_members.py).

For each: ``__all__`` is in ruff's isort-style order (RUF022: SCREAMING_SNAKE_CASE, then CamelCase, then the
rest, each in natural order) and has no duplicate; every name in it resolves on the package; and every
public attribute of the package that is not a submodule is in it, so that nothing is exported by accident.
The client's top-level names are pinned outright: removing or adding one is an API change.
"""

from __future__ import annotations

import importlib
import re
import types
from pathlib import Path

import eerl
import eerl_sim
import pytest

import eerlctl
import eerld

PACKAGES = [
    "eerl",
    "eerl.integrations",
    "eerl.job",
    "eerl.link",
    "eerl.ray",
    "eerld",
    "eerld.csi.proto",
    "eerld.api.podresources",
    "eerld.config",
    "eerld.csi",
    "eerld.daemon",
    "eerld.gpu",
    "eerld.metrics",
    "eerlctl",
    "eerl_sim.gpu",
]

ACCIDENTAL_EXPORTS: dict[str, pytest.MarkDecorator] = {}
"""Known accidental exports, each to be fixed in the package (then its xfail, strict, fails here)."""

EERL_PUBLIC_API = {
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


def isort_style_key(name: str) -> tuple[int, list[int | str]]:
    """RUF022's order: constants, then classes, then the rest; digits compared as numbers."""
    if name.isupper():
        category = 0
    elif name[:1].isupper():
        category = 1
    else:
        category = 2
    return category, [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def public_attributes(module: types.ModuleType) -> set[str]:
    """What ``from module import *`` would take without ``__all__``, less submodules and ``annotations``."""
    return {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    }


def declared_all(name: str) -> list[str]:
    exported = importlib.import_module(name).__all__
    assert isinstance(exported, list)
    assert all(isinstance(n, str) for n in exported)
    return exported


def test_every_package_that_declares_all_is_checked_here() -> None:
    roots = {
        "eerld": Path(eerld.__file__).parent,
        "eerlctl": Path(eerlctl.__file__).parent,
        "eerl": Path(eerl.__file__).parent,
        "eerl_sim": Path(eerl_sim.__file__).parent,
    }
    found = set()
    for top, root in roots.items():
        for init in root.rglob("__init__.py"):
            if "v1" in init.relative_to(root).parts:  # generated protobuf code
                continue
            if re.search(r"^__all__\s*[:=]", init.read_text(), flags=re.MULTILINE):
                parts = init.parent.relative_to(root).parts
                found.add(".".join((top, *parts)))
    assert found == set(PACKAGES)


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_isort_style_without_duplicates(name: str) -> None:
    exported = declared_all(name)
    assert len(exported) == len(set(exported)), f"duplicates in {name}.__all__"
    assert exported == sorted(exported, key=isort_style_key)


@pytest.mark.parametrize("name", PACKAGES)
def test_every_name_in_all_resolves(name: str) -> None:
    module = importlib.import_module(name)
    missing = [n for n in declared_all(name) if not hasattr(module, n)]
    assert missing == []


@pytest.mark.parametrize(
    "name", [pytest.param(n, marks=ACCIDENTAL_EXPORTS[n]) if n in ACCIDENTAL_EXPORTS else n for n in PACKAGES]
)
def test_nothing_public_is_exported_by_accident(name: str) -> None:
    module = importlib.import_module(name)
    assert public_attributes(module) - set(declared_all(name)) == set()


def test_the_client_top_level_api_is_exactly_the_pinned_set() -> None:
    assert set(eerl.__all__) == EERL_PUBLIC_API
    assert {n for n in EERL_PUBLIC_API if not n.startswith("_")} == public_attributes(eerl)


def test_the_isort_style_key_orders_as_ruff_does() -> None:
    names = ["connect", "Session", "DEFAULT_SOCKET_PATH", "__version__", "GPU10", "GPU9", "ClientError"]
    assert sorted(names, key=isort_style_key) == [
        "DEFAULT_SOCKET_PATH",
        "GPU9",
        "GPU10",
        "ClientError",
        "Session",
        "__version__",
        "connect",
    ]
