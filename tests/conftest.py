"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

from eerld.testing import FakeGpuBackend, ManualClock

# `make test` (and CI) draws the same examples every run, so a red build is reproducible and a green one is
# not luck; HYPOTHESIS_PROFILE=explore draws fresh random examples to hunt for new failures.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    """In-process daemons and ``main()`` configure structlog process-wide; give every test the defaults.

    ``cache_logger_on_first_use`` binds each module's logger to the configuration of its first line, and
    eerld's JSON logger writes plain lines without the processor chain, where ``capture_logs`` listens: so
    the loggers cached during a test are un-cached too, and a later test's ``capture_logs`` sees every line
    whatever ran before it.
    """
    yield
    structlog.reset_defaults()
    _uncache_module_loggers()


_LAZY_LOGGER = type(structlog.get_logger())
_OUR_PACKAGES = ("eerld", "eerlctl", "eerl", "eerl_sim", "demo", "perf", "soak", "tests")


def _uncache_module_loggers() -> None:
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".", 1)[0] not in _OUR_PACKAGES:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, _LAZY_LOGGER) and "bind" in vars(value):
                del value.bind  # the instance's cached bind: the class's assembles from the configuration


@contextmanager
def short_socket_dir(prefix: str = "eerl-") -> Iterator[Path]:
    """A directory with a short path under /tmp, removed afterwards: Unix socket paths hold at most 107
    bytes, which pytest's ``tmp_path`` can exceed. The one helper for every test that binds a socket."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (:func:`short_socket_dir`)."""
    with short_socket_dir() as path:
        yield path


@pytest.fixture
def clock() -> ManualClock:
    """Time that moves only when the test says so."""
    return ManualClock()


@pytest.fixture
def fake(clock: ManualClock) -> FakeGpuBackend:
    """Four fake GPUs driven by the manual clock (tests/client overrides ``fake`` with a fake daemon)."""
    return FakeGpuBackend(4, clock=clock)
