"""Fixtures for the client tests: a recording fake daemon, the real daemon on the sim backend, fast tuning."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest
from eerl import ClientConfig
from eerl.phases import PhaseKind
from eerl.testing import FakeDaemon

from eerld.api.server import Server, create_server
from eerld.config import Config
from eerld.daemon import PhaseRecord, SessionView
from eerld.gpu import GpuBackend


def wait_until(predicate: Callable[[], bool], timeout_s: float = 10.0) -> bool:
    """Polls ``predicate`` until it holds (True) or ``timeout_s`` passed (False)."""
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.005)
    return True


def fast(config: ClientConfig, **overrides: float) -> ClientConfig:
    """The same config with back-off and timeouts small enough for tests."""
    tuning: dict[str, float] = {
        "reconnect_initial_s": 0.02,
        "reconnect_max_s": 0.1,
        "rpc_timeout_s": 2.0,
        "close_timeout_s": 2.0,
    }
    tuning.update(overrides)
    return dataclasses.replace(config, **tuning)  # type: ignore[arg-type]


@pytest.fixture
def fake(sock_dir: Path) -> Iterator[FakeDaemon]:
    """A running recording fake daemon."""
    with FakeDaemon(sock_dir / "eerld.sock") as daemon:
        yield daemon


@pytest.fixture
def config(fake: FakeDaemon) -> ClientConfig:
    """A fast client config that reaches ``fake``."""
    return fast(fake.config)


class SimDaemon:
    """The real eerld (worker and admin sockets, sim GPU backend) in this process, restartable.

    ``records`` collects every phase the daemon metered (its phase observer hook), across restarts.
    """

    def __init__(
        self,
        directory: Path,
        *,
        controller: str = "off",
        fixed_clocks_mhz: Mapping[PhaseKind, int] | None = None,
        backend: GpuBackend | None = None,
    ) -> None:
        self.directory = directory
        self.controller = controller
        self.fixed_clocks_mhz = fixed_clocks_mhz
        self.backend = backend
        """A sim backend of the caller's (whose device the caller also runs work on); default: a new one."""
        self.records: list[PhaseRecord] = []
        self._server: Server | None = None

    @property
    def socket_path(self) -> Path:
        return self.directory / "eerld.sock"

    @property
    def config(self) -> ClientConfig:
        return fast(ClientConfig.uds(self.socket_path))

    def start(self) -> SimDaemon:
        config = dataclasses.replace(
            Config(),
            backend="sim",
            sim_gpus=2,
            socket_path=self.socket_path,
            admin_socket_path=self.directory / "admin.sock",
            state_dir=self.directory / "state",
            tenancy="single",
            controller=self.controller,
            metrics_address=None,
        )
        if self.fixed_clocks_mhz is not None:
            config = dataclasses.replace(config, fixed_clocks_mhz=self.fixed_clocks_mhz)
        server = create_server(config, backend=self.backend)
        server.daemon.events.subscribe(on_phase=self.records.append)
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.stop(grace_s=0.2)

    def gpu_uuid(self, index: int) -> str:
        assert self._server is not None
        return self._server.daemon.reads.gpu_status()[index].info.uuid

    def sessions(self) -> tuple[SessionView, ...]:
        assert self._server is not None
        return self._server.daemon.reads.sessions()


@pytest.fixture
def sim_daemon(sock_dir: Path) -> Iterator[SimDaemon]:
    """The real daemon on the sim backend, serving on a Unix socket."""
    daemon = SimDaemon(sock_dir).start()
    yield daemon
    daemon.stop()
