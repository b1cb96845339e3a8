"""Scoped worker sockets: claim tickets from the other sockets, sessions that name no GPU, clear refusals."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import eerl
import grpc
import pytest
from eerl import ClientConfig
from eerl.testing import FakeDaemon
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

from .conftest import fast

PATIENCE_S = 30.0
"""How long to wait for what must happen (generous: the machine is shared and noisy)."""
NOBODY_UID = 65534


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eerl" and r.levelno >= logging.WARNING]


@pytest.fixture
def scoped(sock_dir: Path) -> Iterator[FakeDaemon]:
    """A fake daemon on a scoped socket (a GPU's): a session may name no GPUs."""
    with FakeDaemon(sock_dir / "gpu-0.sock", scoped=True) as daemon:
        yield daemon


@pytest.fixture
def others(sock_dir: Path) -> Iterator[list[FakeDaemon]]:
    """Two more fake sockets of the same node, each of which issues claim tickets."""
    with FakeDaemon(sock_dir / "gpu-1.sock") as one, FakeDaemon(sock_dir / "gpu-2.sock") as two:
        yield [one, two]


class TestClaimTickets:
    def test_the_session_carries_a_fresh_ticket_from_each_other_socket(
        self, scoped: FakeDaemon, others: list[FakeDaemon]
    ) -> None:
        config = fast(ClientConfig.uds(scoped.socket_path, *(o.socket_path for o in others)))
        with eerl.connect(gpus=[0, 1, 2], config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
        (opened,) = scoped.sessions
        assert opened.claim_tickets == tuple(o.tickets_issued[0] for o in others)
        assert [o.sessions for o in others] == [[], []]  # tickets only: the session lives on the first

    def test_a_reopened_session_asks_for_new_tickets(
        self, scoped: FakeDaemon, others: list[FakeDaemon]
    ) -> None:
        config = fast(ClientConfig.uds(scoped.socket_path, *(o.socket_path for o in others)))
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
            scoped.stop()
            scoped.start()
            assert scoped.wait_for(lambda f: len(f.sessions) == 2, PATIENCE_S)
        first, reopened = (s.claim_tickets for s in scoped.sessions)
        assert first == tuple(o.tickets_issued[0] for o in others)
        # An open tried while the daemon restarts spends its tickets too: the reopened session holds new
        # ones, each from its own socket.
        assert all(len(o.tickets_issued) >= 2 for o in others)
        assert all(t in o.tickets_issued[1:] for t, o in zip(reopened, others, strict=True))

    def test_a_socket_that_gives_no_ticket_is_skipped_with_one_warning(
        self, scoped: FakeDaemon, others: list[FakeDaemon], caplog: pytest.LogCaptureFixture
    ) -> None:
        others[0].refuse("IssueClaimTicket", grpc.StatusCode.PERMISSION_DENIED, "not yours")
        config = fast(ClientConfig.uds(scoped.socket_path, *(o.socket_path for o in others)))
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
            scoped.stop()
            scoped.start()
            assert scoped.wait_for(lambda f: len(f.sessions) == 2, PATIENCE_S)
        issued = others[1].tickets_issued
        first, reopened = (s.claim_tickets for s in scoped.sessions)
        assert first == (issued[0],)  # the refusing socket's ticket is left out
        # The reopened session holds a new ticket (an open tried mid-restart may have spent one before it).
        assert len(reopened) == 1
        assert reopened[0] in issued[1:]
        tickets = [w for w in _warnings(caplog) if "claim ticket" in w]
        assert len(tickets) == 1
        assert str(others[0].socket_path) in tickets[0]
        assert "not yours" in tickets[0]


class TestNoGpusNamed:
    def test_on_a_scoped_socket_the_session_names_no_gpus_and_the_daemon_claims_what_it_covers(
        self, scoped: FakeDaemon, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        with eerl.connect(config=fast(ClientConfig.uds(scoped.socket_path, scoped=True))) as session:
            assert session.enabled
            assert session.wait_until_connected(PATIENCE_S)
        assert list(scoped.sessions[0].request.gpus) == []

    def test_with_several_sockets_no_gpus_named_is_fine_too(
        self, scoped: FakeDaemon, others: list[FakeDaemon], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        config = fast(ClientConfig.uds(scoped.socket_path, others[0].socket_path))
        with eerl.connect(config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
        assert len(scoped.sessions[0].claim_tickets) == 1

    def test_the_fake_of_a_shared_socket_refuses_a_session_that_names_no_gpus(self, fake: FakeDaemon) -> None:
        with (
            grpc.insecure_channel(f"unix:{fake.socket_path}") as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            eerl_pb2_grpc.PhaseServiceStub(channel).OpenSession(
                eerl_pb2.OpenSessionRequest(job_id="j"), timeout=5
            )
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT


class TestRefusal:
    def test_a_daemon_that_refuses_the_session_gets_one_warning_with_its_reason_and_the_longest_back_off(
        self, fake: FakeDaemon, caplog: pytest.LogCaptureFixture
    ) -> None:
        fake.refuse("OpenSession", grpc.StatusCode.PERMISSION_DENIED, "the shared socket admits no claims")
        config = fast(fake.config, reconnect_initial_s=0.01, reconnect_max_s=120.0)
        with eerl.connect(gpus=[0], config=config) as session:
            assert fake.wait_for(lambda f: f.calls("OpenSession") == 1, PATIENCE_S)
            time.sleep(0.5)  # at the initial back-off, this would see several more attempts
            attempts = fake.calls("OpenSession")
            assert not session.stats().connected
        assert attempts == 1
        (warning,) = _warnings(caplog)
        assert "the shared socket admits no claims" in warning
        assert "ask for a grant: eerlctl grant, see docs/security.md" in warning
        assert "retries every 120 s" in warning

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root to play a user the socket keeps out")
    def test_a_socket_the_kernel_keeps_this_user_out_of_gets_one_warning_naming_it(
        self, sock_dir: Path
    ) -> None:
        sock_dir.chmod(0o755)
        with FakeDaemon(sock_dir / "eerld.sock") as fake:
            fake.socket_path.chmod(0o600)  # root's: connecting needs write permission on the socket
            outcome = _connect_as_nobody(fake.socket_path)
            assert fake.sessions == []
        (warning,) = outcome["warnings"]
        assert f"permission denied connecting to eerld's socket {fake.socket_path}" in warning
        assert "ask for a grant: eerlctl grant, see docs/security.md" in warning
        assert outcome["connect_failures"] == 1  # then the longest back-off


_AS_NOBODY = """
import json, logging, os, sys, time
import eerl, grpc
from eerl import ClientConfig
from eerl.link.opening import refused_by_kernel  # everything imported before dropping privileges
grpc.insecure_channel("unix:/nonexistent").close()
records = []
handler = logging.Handler()
handler.emit = records.append
logging.getLogger("eerl").addHandler(handler)
os.setgroups([])
os.setgid({uid})
os.setuid({uid})
config = ClientConfig(transport="uds", socket_path=sys.argv[1], reconnect_initial_s=0.01, reconnect_max_s=60)
session = eerl.connect(gpus=[0], config=config)
deadline = time.monotonic() + {patience}
while not records and time.monotonic() < deadline:
    time.sleep(0.01)
time.sleep(0.3)
stats = session.stats()
session.close()
warnings = [r.getMessage() for r in records if r.levelno >= logging.WARNING]
print(json.dumps({{"warnings": warnings, "connect_failures": stats.connect_failures}}))
"""


def _connect_as_nobody(socket_path: Path) -> dict[str, object]:
    code = _AS_NOBODY.format(uid=NOBODY_UID, patience=PATIENCE_S)
    done = subprocess.run(
        [sys.executable, "-c", code, str(socket_path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    outcome: dict[str, object] = json.loads(done.stdout)
    return outcome
