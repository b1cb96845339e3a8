"""Sockets, health, reflection and the command line of eerld."""

from __future__ import annotations

import grp
import json
import os
import socket
import stat
from pathlib import Path

import grpc
import pytest
from eerl.phases import PhaseKind
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import create_sim_backend
from eerl_sim.profiles import builtin_profile
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from eerld.api.server import prepare_socket_path
from eerld.app import create_backend
from eerld.config import Config, load_config
from eerld.errors import ConfigError
from eerld.gpu.base import GpuBackend
from eerld.main import main
from eerld.testing import FakeGpuBackend, running_daemon
from soak.daemon import DaemonProcess, wait_for
from tests.eerld.conftest import GEN, begin, open_session


class TestSockets:
    def test_the_worker_socket_is_0660_and_the_admin_socket_0600(self, daemon):
        assert stat.S_IMODE(daemon.socket_path.stat().st_mode) == 0o660
        assert stat.S_IMODE(daemon.admin_socket_path.stat().st_mode) == 0o600

    def test_a_stale_socket_of_a_dead_daemon_is_removed(self, sock_dir):
        path = sock_dir / "old.sock"
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(str(path))
        listener.close()
        prepare_socket_path(path, "--socket")
        assert not path.exists()

    def test_a_live_daemon_on_the_path_makes_the_start_fail_clearly(self, daemon, start_daemon):
        with pytest.raises(ConfigError, match="another eerld is already serving"), start_daemon():
            pass

    def test_a_path_that_is_not_a_socket_is_never_removed(self, sock_dir):
        path = sock_dir / "file"
        path.write_text("keep me")
        with pytest.raises(ConfigError, match="not a socket"):
            prepare_socket_path(path, "--socket")
        assert path.read_text() == "keep me"


class TestHealthAndReflection:
    @pytest.mark.parametrize("which", ["socket_path", "admin_socket_path"])
    def test_both_sockets_report_serving(self, daemon, which):
        with grpc.insecure_channel(f"unix:{getattr(daemon, which)}") as channel:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
        assert reply.status == health_pb2.HealthCheckResponse.SERVING

    def test_health_is_not_serving_once_the_daemon_stops(self, daemon):
        daemon.server.stop(grace_s=0)
        assert daemon.server.worker_health.Check(health_pb2.HealthCheckRequest(), None).status == (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )

    def test_reflection_lists_the_phase_service_on_the_worker_socket_only(self, daemon):
        def services(path: Path) -> set[str]:
            with grpc.insecure_channel(f"unix:{path}") as channel:
                stub = reflection_pb2_grpc.ServerReflectionStub(channel)
                replies = stub.ServerReflectionInfo(
                    iter([reflection_pb2.ServerReflectionRequest(list_services="")])
                )
                return {s.name for s in next(replies).list_services_response.service}

        assert "eerl.v1.PhaseService" in services(daemon.socket_path)
        assert "eerl.v1.AdminService" not in services(daemon.socket_path)
        assert "eerl.v1.AdminService" in services(daemon.admin_socket_path)


class TestStop:
    def test_stopping_resets_every_locked_gpu_but_keeps_pins_on_disk(
        self, daemon, phase, admin, fake, sock_dir
    ):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        admin.Pin(pb.PinRequest(gpus=[pb.GpuRef(index=2)], sm_clock_mhz=900, reason="thermal"))
        assert fake.locked() == {0: 1200, 2: 900}  # what the stop has to reset
        daemon.server.stop(grace_s=0)
        assert fake.locked() == {}
        pins = json.loads((sock_dir / "state" / "pins.json").read_text())["pins"]
        assert [(p["sm_clock_mhz"], p["reason"]) for p in pins] == [(900, "thermal")]


class TestConfig:
    def test_flags_override_the_config_file(self, sock_dir):
        path = sock_dir / "eerld.toml"
        path.write_text(
            'controller = "fixed"\nfixed_clocks = { generation = 1200 }\nsocket = "/tmp/a.sock"\n'
        )
        path.chmod(0o644)
        config = load_config(["--config", str(path), "--socket", "/tmp/b.sock"])
        assert config.socket_path == Path("/tmp/b.sock")
        assert config.controller == "fixed"
        assert config.fixed_clocks_mhz == {PhaseKind.GENERATION: 1200}

    def test_defaults_are_the_production_paths(self):
        config = Config()
        assert (config.socket_path, config.admin_socket_path, config.state_dir) == (
            Path("/run/eerld/eerld.sock"),
            Path("/run/eerld/admin.sock"),
            Path("/var/lib/eerld"),
        )
        assert config.metrics_address == "127.0.0.1:9478"

    def test_a_config_file_writable_by_others_is_refused(self, sock_dir):
        path = sock_dir / "eerld.toml"
        path.write_text('backend = "sim"\n')
        path.chmod(0o666)
        with pytest.raises(ConfigError, match="writable"):
            load_config(["--config", str(path)])

    @pytest.mark.parametrize(
        ("argv", "names"),
        [
            (["--backend", "cuda"], "--backend"),
            (["--sim-gpus", "0"], "--sim-gpus"),
            (["--sim-speedup", "nan"], "--sim-speedup"),
            (["--controller", "magic"], "--controller"),
            (["--controller", "fixed"], "--fixed-clocks"),
            (["--fixed-clocks", "decode=1200"], "--fixed-clocks"),
            (["--fixed-clocks", "generation=fast"], "--fixed-clocks"),
            (["--listen", "0.0.0.0:7000"], "mutual TLS"),
            (["--listen", "nonsense"], "--listen"),
            (["--metrics-address", "localhost:99999"], "--metrics-address"),
            (["--socket-group", "no-such-group-eerl"], "--socket-group"),
            (["--log-format", "xml"], "--log-format"),
            (["--lease-ttl", "-3"], "--lease-ttl"),
            (["--socket", "/tmp/x.sock", "--admin-socket", "/tmp/x.sock"], "--admin-socket"),
            (["--no-such-flag"], "no-such-flag"),
            (["--dry-run", "--reset-clocks"], "--dry-run"),
            (["--energy-sample-ms", "-1"], "--energy-sample-ms"),
        ],
    )
    def test_a_bad_value_gives_one_error_line_naming_it_and_exit_code_2(self, argv, names, capsys):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("Error: ")
        assert err.count("\n") == 1
        assert names in err


class TestSimProfile:
    """eerl-sim checks --sim-profile where the sim backend is built: one error line, exit code 2."""

    @pytest.mark.parametrize("mode", [[], ["--reset-clocks"]])
    def test_an_unknown_sim_profile_stops_the_start_with_one_error_line_and_exit_code_2(
        self, sock_dir, capsys, mode
    ):
        argv = [
            "--backend=sim",
            "--sim-profile=a100",
            f"--socket={sock_dir / 'w.sock'}",
            f"--admin-socket={sock_dir / 'a.sock'}",
            f"--state-dir={sock_dir / 'state'}",
            "--metrics-address=off",
            *mode,
        ]
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            "Error: unknown GPU profile 'a100'; built-in profiles: a100-sxm, a40, gb200, h100-sxm\n"
        )
        assert not (sock_dir / "w.sock").exists()


class TestResetClocks:
    def test_reset_clocks_resets_every_gpu_and_empties_the_ledger_then_exits_zero(self, sock_dir):
        daemon = DaemonProcess(sock_dir, gpus=2, sim_speedup=1.0)  # the speed-up of the state file below
        backend = create_sim_backend(builtin_profile("h100-sxm"), 2, state_file=daemon.state_file)
        backend.lock_sm_clock(1, 1200)
        backend.close()
        result = daemon.reset_clocks(timeout_s=60)
        assert result.returncode == 0, result.stderr
        backend = create_sim_backend(builtin_profile("h100-sxm"), 2, state_file=daemon.state_file)
        assert backend.device.observe(1).sm_lock_mhz is None
        assert json.loads((daemon.state_dir / "ledger.json").read_text())["locked"] == []


def test_the_fake_backend_implements_the_gpu_backend_protocol():
    assert isinstance(FakeGpuBackend(1), GpuBackend)


class TestGroups:
    def test_with_groups_both_sockets_are_0660_and_owned_by_their_groups(self, start_daemon):
        group = grp.getgrgid(os.getgid()).gr_name
        with start_daemon(socket_group=group, admin_group=group) as handle:
            for path in (handle.socket_path, handle.admin_socket_path):
                assert stat.S_IMODE(path.stat().st_mode) == 0o660
                assert path.stat().st_gid == os.getgid()


class TestStartFailures:
    def test_a_metrics_address_in_use_fails_the_start_with_one_error_line_and_leaves_no_socket(
        self, sock_dir, capsys
    ):
        busy = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        try:
            code = main(
                [
                    "--backend=sim",
                    "--sim-gpus=1",
                    f"--socket={sock_dir / 'w.sock'}",
                    f"--admin-socket={sock_dir / 'a.sock'}",
                    f"--state-dir={sock_dir / 'state'}",
                    f"--metrics-address=127.0.0.1:{port}",
                    "--log-format=json",
                ]
            )
        finally:
            busy.close()
        err = capsys.readouterr().err
        assert code == 2
        assert [line for line in err.splitlines() if line.startswith("Error: ")] != []
        assert not (sock_dir / "w.sock").exists()


class TestSystemdReadiness:
    def test_the_daemon_tells_systemd_it_is_ready_once_serving_and_stopping_when_it_stops(
        self, sock_dir, monkeypatch
    ):
        """With NOTIFY_SOCKET set (Type=notify), READY=1 arrives after start and STOPPING=1 at stop."""
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(str(sock_dir / "notify"))
        notify.settimeout(5.0)
        monkeypatch.setenv("NOTIFY_SOCKET", str(sock_dir / "notify"))
        with running_daemon(sock_dir, reaper=False):
            assert b"READY=1" in notify.recv(4096).split(b"\n")
        assert notify.recv(4096) == b"STOPPING=1"
        notify.close()


class TestClockActuator:
    def test_an_unknown_actuator_is_refused_with_one_clear_line(self):
        """--clock-actuator takes lock or application only."""
        with pytest.raises(ConfigError, match="--clock-actuator: expected one of lock, application"):
            load_config(["--clock-actuator", "turbo"])

    def test_the_application_actuator_moves_the_clock_where_locks_do_not_work(self, sock_dir):
        """With --clock-actuator application the sim GPUs refuse locks, and sessions still get their clock."""
        config = load_config(["--backend", "sim", "--sim-gpus", "1", "--clock-actuator", "application"])
        backend = create_backend(config)
        assert not backend.supports_locked_clocks(0)
        with (
            running_daemon(sock_dir, backend=backend, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            sid = open_session(stub, 0).session_id
            reply = begin(stub, sid, GEN, 0)
            assert reply.clocks[0].requested_sm_clock_mhz == 1200
            # The new clock holds once the simulated switch time (15 ms) has passed.
            wait_for(lambda: backend.clocks(0).sm_clock_mhz == 1200, "the new clock to hold")
