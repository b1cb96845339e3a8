"""Controllers by name, for ``--controller``: ``eerl`` (online EE-RL, the default), ``fixed`` and ``off``."""

from __future__ import annotations

from eerl.control.base import ControllerFactory
from eerl.control.eerl import create_eerl_controller, create_job_eerl_controller
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


_JOB_FACTORIES: dict[str, ControllerFactory] = _FACTORIES | {"eerl": create_job_eerl_controller}
"""For a job-level controller (``eerl.job``): ``eerl`` tuned for a job across nodes (JOB_CONFIG)."""


def controller_factory(name: str, *, job: bool = False) -> ControllerFactory:
    """The factory for a controller name (``job``: as a job-level controller wraps it); ConfigError for
    an unknown one."""
    try:
        return (_JOB_FACTORIES if job else _FACTORIES)[name]
    except KeyError:
        raise ConfigError(
            f"--controller: unknown controller {name!r} (choose from {', '.join(CONTROLLER_NAMES)})"
        ) from None
