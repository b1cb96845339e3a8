"""eerl: the thin, fail-open client of the eerld clock daemon."""

__version__ = "0.1.0"
__all__ = ["__version__"]
