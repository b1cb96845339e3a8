"""The lease cap (``--max-lease-ttl``): no session's lease is longer, whatever it asks for.

The attack it answers is in tests/security/test_claim_lifetime.py (a real daemon, a job SIGKILLed mid-phase
after asking for an hour); here the rules themselves, on manual time: what is granted and said in the
reply, when the session ends, that a stream-bound session is untouched, and the flag's validation.
"""

from __future__ import annotations

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from structlog.testing import capture_logs

from eerld.config import load_config
from eerld.errors import ConfigError
from eerld.main import main
from eerld.sessions import DEFAULT_MAX_LEASE_TTL_S
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import GEN, DaemonFactory, begin, open_session


class TestTheCap:
    def test_a_session_asking_for_an_hour_is_granted_the_cap_and_ends_once_it_passes(
        self, start_daemon: DaemonFactory, fake: FakeGpuBackend, clock: ManualClock
    ) -> None:
        with (
            start_daemon() as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
            capture_logs() as logs,
        ):
            phase = pb_grpc.PhaseServiceStub(channel)
            opened = open_session(phase, 0, lease_ttl_s=3600.0)
            begin(phase, opened.session_id, GEN, 0)
            clock.advance(DEFAULT_MAX_LEASE_TTL_S - 1)
            handle.daemon.tick()
            held_before = fake.locked()
            clock.advance(1.5)
            handle.daemon.tick()
            held_after = fake.locked()
            sessions = handle.daemon.reads.sessions()
        assert opened.lease_ttl_s == DEFAULT_MAX_LEASE_TTL_S == 30.0
        assert held_before == {0: 1200}
        assert (held_after, sessions) == ({}, ())
        [capped] = [e for e in logs if e["event"] == "lease_capped"]
        assert (capped["asked_s"], capped["granted_s"]) == (3600.0, 30.0)
        assert [e["reason"] for e in logs if e["event"] == "session_close"] == ["lease expired"]

    def test_a_lease_below_the_cap_is_granted_as_asked_and_not_logged(
        self, start_daemon: DaemonFactory
    ) -> None:
        with (
            start_daemon(max_lease_ttl_s=20.0) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
            capture_logs() as logs,
        ):
            phase = pb_grpc.PhaseServiceStub(channel)
            asked = open_session(phase, 0, lease_ttl_s=20.0).lease_ttl_s
            default = open_session(phase, 1).lease_ttl_s
            over = open_session(phase, 2, lease_ttl_s=21.0).lease_ttl_s
        assert (asked, default, over) == (20.0, 10.0, 20.0)
        assert len([e for e in logs if e["event"] == "lease_capped"]) == 1

    def test_a_heartbeat_renews_by_the_granted_lease_only(
        self, start_daemon: DaemonFactory, clock: ManualClock
    ) -> None:
        with start_daemon() as handle, grpc.insecure_channel(f"unix:{handle.socket_path}") as channel:
            phase = pb_grpc.PhaseServiceStub(channel)
            opened = open_session(phase, 0, lease_ttl_s=3600.0)
            clock.advance(20.0)
            remaining = phase.Heartbeat(pb.HeartbeatRequest(session_id=opened.session_id)).lease_remaining_s
        assert remaining == pytest.approx(DEFAULT_MAX_LEASE_TTL_S)

    def test_a_session_bound_to_its_attach_stream_outlives_the_cap(
        self, start_daemon: DaemonFactory, fake: FakeGpuBackend, clock: ManualClock
    ) -> None:
        """The cap is on leases: a stream-bound session ends with its stream, as before."""
        with start_daemon() as handle, grpc.insecure_channel(f"unix:{handle.socket_path}") as channel:
            phase = pb_grpc.PhaseServiceStub(channel)
            opened = open_session(phase, 0, lease_ttl_s=3600.0)
            stream = phase.Attach(pb.AttachRequest(session_id=opened.session_id))
            next(stream)  # "attached": the session is bound
            begin(phase, opened.session_id, GEN, 0)
            clock.advance(10 * DEFAULT_MAX_LEASE_TTL_S)
            handle.daemon.tick()
            held = fake.locked()
            stream.cancel()
        assert held == {0: 1200}


class TestTheFlag:
    def test_it_is_thirty_seconds_by_default_and_taken_from_the_flag_or_the_file(self, tmp_path) -> None:
        config_file = tmp_path / "eerld.toml"
        config_file.write_text("max_lease_ttl_s = 120\nlease_ttl_s = 60\n")
        config_file.chmod(0o644)
        assert load_config([]).max_lease_ttl_s == 30.0
        assert load_config(["--max-lease-ttl", "5", "--lease-ttl", "5"]).max_lease_ttl_s == 5.0
        from_file = load_config(["--config", str(config_file)])
        assert (from_file.max_lease_ttl_s, from_file.lease_ttl_s) == (120.0, 60.0)

    @pytest.mark.parametrize("value", ["0", "-1", "nan", "3601", "soon"])
    def test_a_bad_value_is_one_error_naming_the_flag(self, value: str) -> None:
        with pytest.raises(ConfigError, match="--max-lease-ttl"):
            load_config(["--max-lease-ttl", value])

    def test_a_default_lease_longer_than_the_cap_is_refused_with_one_clear_line(self, capsys) -> None:
        assert main(["--lease-ttl", "60"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1
        assert err.startswith("Error: --lease-ttl: the default lease (60 s) exceeds --max-lease-ttl (30 s)")
        with pytest.raises(ConfigError, match=r"default lease \(10 s\) exceeds --max-lease-ttl \(5 s\)"):
            load_config(["--max-lease-ttl", "5"])
