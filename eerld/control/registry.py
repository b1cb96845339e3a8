"""Controllers by name, for ``--controller``.

``eerl`` lives in :mod:`eerld.control.eerl` and is looked up lazily, so this module works (and says clearly
why ``eerl`` is unavailable) in a tree where that module does not exist yet.
"""

from __future__ import annotations

import importlib
from typing import cast

from eerld.control.base import ControllerFactory
from eerld.control.simple import create_fixed_controller, create_off_controller
from eerld.errors import ConfigError

CONTROLLER_NAMES = ("eerl", "fixed", "off")
DEFAULT_CONTROLLER = "off"
"""The default of ``--controller``; becomes ``"eerl"`` once the online controller ships."""


def controller_factory(name: str) -> ControllerFactory:
    """The factory for a controller name; ConfigError for an unknown or unavailable one."""
    if name == "fixed":
        return create_fixed_controller
    if name == "off":
        return create_off_controller
    if name == "eerl":
        return _eerl_factory()
    raise ConfigError(
        f"--controller: unknown controller {name!r} (choose from {', '.join(CONTROLLER_NAMES)})"
    )


def _eerl_factory() -> ControllerFactory:
    try:
        module = importlib.import_module("eerld.control.eerl")
    except ImportError as e:
        raise ConfigError(
            f"--controller: 'eerl' is not available in this build ({e}); use 'fixed' or 'off'"
        ) from e
    factory = getattr(module, "create_eerl_controller", None)
    if factory is None or not callable(factory):
        raise ConfigError(
            "--controller: 'eerl' is not available in this build "
            "(eerld.control.eerl has no create_eerl_controller); use 'fixed' or 'off'"
        )
    return cast(ControllerFactory, factory)
