"""The client's version, in one place: the installed eerl-client distribution's (what its wheel carries)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("eerl-client")
except PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"
