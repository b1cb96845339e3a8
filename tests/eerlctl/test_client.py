"""The admin socket's client that eerlctl and the live demo share, against a fake AdminService."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from eerl.phases import PhaseKind
from eerl.v1 import eerl_pb2

from eerlctl.client import AdminClient, socket_target
from tests.eerlctl.fakes import SESSION_ID, FakeAdminServer


class TestSocketTarget:
    def test_a_path_becomes_a_unix_target_and_a_full_target_passes_through(self) -> None:
        """A socket path gets the unix: scheme; unix:, dns: and the other full targets are left as given."""
        assert socket_target(Path("/run/eerld/admin.sock")) == "unix:/run/eerld/admin.sock"
        assert socket_target("unix:///run/a.sock") == "unix:///run/a.sock"
        assert socket_target("dns:localhost:50051") == "dns:localhost:50051"


class TestAdminClient:
    def test_wait_ready_is_true_once_status_answers(self, fake_admin: FakeAdminServer) -> None:
        """A live admin socket is ready within the timeout."""
        with AdminClient(fake_admin.socket_path) as admin:
            assert admin.wait_ready(5.0)

    def test_wait_ready_is_false_without_a_daemon(self, tmp_path: Path) -> None:
        """No socket: False after the timeout, no exception."""
        with AdminClient(tmp_path / "nobody.sock") as admin:
            assert not admin.wait_ready(0.2)

    def test_the_reads_return_the_replies_contents(self, fake_admin: FakeAdminServer) -> None:
        """status is the StatusResponse, sessions and decisions the lists inside their replies."""
        with AdminClient(fake_admin.socket_path) as admin:
            assert len(admin.status().gpus) == 2
            assert [s.session_id for s in admin.sessions()] == [SESSION_ID]
            assert [d.sm_clock_mhz for d in admin.decisions()] == [1410]

    def test_decisions_sends_the_session_kind_and_limit(self, fake_admin: FakeAdminServer) -> None:
        """The request names the session, the phase kind (as its proto enum) and the limit given."""
        with AdminClient(fake_admin.socket_path) as admin:
            admin.decisions(session_id=SESSION_ID, kind=PhaseKind.TRAINING, limit=1)
        request = fake_admin.admin.requests[-1]
        assert request == eerl_pb2.GetDecisionsRequest(
            session_id=SESSION_ID, kind=eerl_pb2.PHASE_KIND_TRAINING, limit=1
        )

    def test_a_failing_call_raises_the_rpc_error(self, fake_admin: FakeAdminServer) -> None:
        """What a failure means is the caller's to say: the client raises grpc.RpcError as the stub does."""
        with AdminClient(fake_admin.socket_path) as admin, pytest.raises(grpc.RpcError) as raised:
            admin.decisions(session_id="no-such-session")
        assert raised.value.code() == grpc.StatusCode.NOT_FOUND
