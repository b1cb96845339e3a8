"""Fixtures of eerlctl's tests: the fake AdminService on a temporary Unix socket."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.eerlctl.fakes import FakeAdminServer, start_fake_admin


@pytest.fixture
def fake_admin(sock_dir: Path) -> Iterator[FakeAdminServer]:
    """A fake AdminService (plus health) on a temporary Unix socket."""
    server = start_fake_admin(sock_dir / "admin.sock")
    try:
        yield server
    finally:
        server.stop()
