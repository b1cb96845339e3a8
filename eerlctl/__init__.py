"""eerlctl: the administrator's command line for eerld, a client of its admin socket.

eerlctl ships in the eerld distribution but is a client like any other: it talks to the daemon only over
the admin (or worker) socket, with the ``eerl.v1`` messages, and imports none of the daemon's internals
(an import contract of pyproject.toml keeps it so).

- :mod:`eerlctl.main` — the command line (``main()`` returns the exit code);
- :mod:`eerlctl.args` — parsing of argument values (GPU lists, durations, clocks, users);
- :mod:`eerlctl.client` — :class:`~eerlctl.client.AdminClient`, the admin socket's client, which tools
  (the demo, perf, soak) use too;
- :mod:`eerlctl.replies` — replies as the JSON-able dicts ``--json`` prints;
- :mod:`eerlctl.render` — those dicts as tables and lines for people;
- :mod:`eerlctl.completion` — bash and zsh completion scripts.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("eerld")  # eerlctl ships in the eerld distribution
except _PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
