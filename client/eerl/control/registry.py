"""Controllers by name, for ``--controller``: ``eerl`` (online EE-RL, the default), ``fixed`` and ``off``."""

from __future__ import annotations

from eerl.control.base import ControllerFactory
from eerl.control.eerl import create_eerl_controller
from eerl.control.simple import create_fixed_controller, create_off_controller
from eerl.errors import ConfigError

CONTROLLER_NAMES = ("eerl", "fixed", "off")
DEFAULT_CONTROLLER = "eerl"
"""The default of ``--controller``."""

_FACTORIES: dict[str, ControllerFactory] = {
    "eerl": create_eerl_controller,
    "fixed": create_fixed_controller,
    "off": create_off_controller,
}


def controller_factory(name: str) -> ControllerFactory:
    """The factory for a controller name; ConfigError for an unknown one."""
    try:
        return _FACTORIES[name]
    except KeyError:
        raise ConfigError(
            f"--controller: unknown controller {name!r} (choose from {', '.join(CONTROLLER_NAMES)})"
        ) from None
