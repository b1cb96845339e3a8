"""sd_notify: systemd's readiness datagram."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from eerld.sdnotify import sd_notify


@pytest.fixture
def notify_socket(sock_dir: Path) -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(sock_dir / "notify"))
    sock.settimeout(5)
    try:
        yield sock
    finally:
        sock.close()


class TestSdNotify:
    def test_sends_the_state_to_notify_socket(self, notify_socket: socket.socket) -> None:
        """READY=1 arrives as one datagram on $NOTIFY_SOCKET."""
        assert sd_notify("READY=1", environ={"NOTIFY_SOCKET": notify_socket.getsockname()})
        assert notify_socket.recv(64) == b"READY=1"

    def test_abstract_socket_names_are_supported(self) -> None:
        """An @name is the abstract namespace, as systemd documents."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind("\0eerl-test-notify")
            sock.settimeout(5)
            assert sd_notify("STOPPING=1", environ={"NOTIFY_SOCKET": "@eerl-test-notify"})
            assert sock.recv(64) == b"STOPPING=1"

    def test_outside_systemd_it_is_a_no_op(self) -> None:
        """Without NOTIFY_SOCKET nothing is sent and the answer is False."""
        assert sd_notify("READY=1", environ={}) is False

    def test_a_dead_socket_never_raises(self, sock_dir: Path) -> None:
        """A NOTIFY_SOCKET that nobody listens on returns False instead of raising."""
        assert sd_notify("READY=1", environ={"NOTIFY_SOCKET": str(sock_dir / "gone")}) is False
