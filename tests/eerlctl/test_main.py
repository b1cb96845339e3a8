"""eerlctl against a fake AdminService on a real Unix-socket channel."""

from __future__ import annotations

import io
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from eerl.v1 import eerl_pb2
from grpc_health.v1 import health_pb2

from eerlctl.completion import COMMANDS, completion_script
from eerlctl.main import main
from tests.eerlctl.fakes import SESSION_ID, FakeAdminServer


def run(fake: FakeAdminServer | Path, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    socket = fake.socket_path if isinstance(fake, FakeAdminServer) else fake
    code = main(["--socket", str(socket), *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def run_json(fake: FakeAdminServer, *argv: str) -> Any:
    code, out, err = run(fake, "--json", *argv)
    assert (code, err) == (0, "")
    return json.loads(out)


class TestStatus:
    def test_json_lists_gpus_with_the_documented_keys(self, fake_admin: FakeAdminServer) -> None:
        """status --json has gpus with index, uuid, sm_clock_mhz, locked_sm_clock_mhz, owner, degraded."""
        status = run_json(fake_admin, "status")
        keys = {"index", "uuid", "sm_clock_mhz", "locked_sm_clock_mhz", "owner", "degraded"}
        assert [keys <= set(gpu) for gpu in status["gpus"]] == [True, True]
        assert isinstance(status["sessions"], list)

    def test_json_uses_null_for_no_lock_and_no_owner(self, fake_admin: FakeAdminServer) -> None:
        """A free GPU on the default governor has locked_sm_clock_mhz and owner null."""
        free = run_json(fake_admin, "status")["gpus"][1]
        assert (free["locked_sm_clock_mhz"], free["owner"], free["source"]) == (None, None, "default")

    def test_json_names_the_session_owning_a_gpu(self, fake_admin: FakeAdminServer) -> None:
        """GPU 0's owner is the session of job-42 rank 0, locked at the controller's clock."""
        gpu = run_json(fake_admin, "status")["gpus"][0]
        assert gpu["owner"]["job_id"] == "job-42"
        assert gpu["locked_sm_clock_mhz"] == 1410

    def test_json_reports_energy_in_joules_and_enums_as_words(self, fake_admin: FakeAdminServer) -> None:
        """Energies are joules (the proto's mJ / 1000) and states are lower-case words."""
        status = run_json(fake_admin, "status")
        assert status["gpus"][0]["energy_j"] == pytest.approx(123_456.789)
        phase = status["sessions"][0]["phases"][0]
        assert (phase["kind"], phase["state"], phase["energy_j"]) == ("generation", "committed", 3600.0)

    def test_table_shows_gpus_and_sessions(self, fake_admin: FakeAdminServer) -> None:
        """The table names each GPU, the owning job and the controller's state per phase."""
        code, out, _ = run(fake_admin, "status")
        assert code == 0
        assert "NVIDIA H100 80GB HBM3" in out
        assert "job job-42 rank 0" in out
        assert "committed" in out
        assert "baseline" in out

    def test_global_options_work_after_the_command(self, fake_admin: FakeAdminServer) -> None:
        """`eerlctl status --json` is the same as `eerlctl --json status`."""
        out = io.StringIO()
        code = main(["status", "--json", "--socket", str(fake_admin.socket_path)], out=out, err=io.StringIO())
        assert code == 0
        assert "gpus" in json.loads(out.getvalue())

    def test_the_socket_comes_from_the_environment(
        self, fake_admin: FakeAdminServer, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Without --socket, EERLCTL_SOCKET names the admin socket."""
        monkeypatch.setenv("EERLCTL_SOCKET", str(fake_admin.socket_path))
        out = io.StringIO()
        assert main(["--json", "status"], out=out, err=io.StringIO()) == 0


class TestPin:
    def test_pin_sends_gpus_clock_duration_and_reason(self, fake_admin: FakeAdminServer) -> None:
        """pin --gpus 0,1 --sm-mhz 1200 --for 30m --reason sends one PinRequest with 1800 s."""
        code, out, _ = run(
            fake_admin, "pin", "--gpus", "0,1", "--sm-mhz", "1200", "--for", "30m", "--reason", "x"
        )
        request = fake_admin.admin.requests[-1]
        assert isinstance(request, eerl_pb2.PinRequest)
        assert [g.index for g in request.gpus] == [0, 1]
        assert (request.sm_clock_mhz, request.duration_s, request.reason) == (1200, 1800.0, "x")
        assert code == 0
        assert "GPU 1: pinned; SM clock now 1200 MHz, decided by an admin pin" in out

    def test_a_pin_shows_in_status(self, fake_admin: FakeAdminServer) -> None:
        """After a pin, status --json shows the pin with its reason under the GPU's owner."""
        run(fake_admin, "pin", "--gpus", "1", "--sm-mhz", "1200", "--reason", "maintenance")
        gpu = run_json(fake_admin, "status")["gpus"][1]
        assert gpu["owner"]["pin"]["reason"] == "maintenance"
        assert gpu["locked_sm_clock_mhz"] == 1200

    def test_pin_all_sets_the_all_flag(self, fake_admin: FakeAdminServer) -> None:
        """--gpus all pins every GPU of the node."""
        run(fake_admin, "pin", "--gpus", "all", "--sm-mhz", "1200")
        request = fake_admin.admin.requests[-1]
        assert isinstance(request, eerl_pb2.PinRequest)
        assert request.all

    def test_gpus_may_be_named_by_uuid(self, fake_admin: FakeAdminServer) -> None:
        """A GPU- UUID in --gpus becomes a GpuRef by UUID."""
        run(fake_admin, "unpin", "--gpus", "GPU-1111aaaa-0000-0000-0000-000000000000")
        request = fake_admin.admin.requests[-1]
        assert isinstance(request, eerl_pb2.UnpinRequest)
        assert request.gpus[0].uuid == "GPU-1111aaaa-0000-0000-0000-000000000000"

    def test_an_unsupported_clock_names_the_nearest_supported_ones(self, fake_admin: FakeAdminServer) -> None:
        """A pin to 1201 MHz fails with one Error line that names 1200 and 1215 MHz."""
        code, out, err = run(fake_admin, "pin", "--gpus", "0", "--sm-mhz", "1201")
        assert (code, out) == (1, "")
        assert err.count("\n") == 1
        assert err.startswith("Error: ")
        assert "1200" in err
        assert "1215" in err

    def test_bad_arguments_fail_before_calling_the_daemon(self, fake_admin: FakeAdminServer) -> None:
        """A malformed --for is reported as one Error line and nothing is sent."""
        code, _, err = run(fake_admin, "pin", "--gpus", "0", "--sm-mhz", "1200", "--for", "soon")
        assert code == 1
        assert err.startswith("Error: --for:")
        assert fake_admin.admin.requests == []

    def test_unpin_all_sets_the_all_flag(self, fake_admin: FakeAdminServer) -> None:
        """unpin --gpus all removes every pin."""
        run(fake_admin, "pin", "--gpus", "all", "--sm-mhz", "1200")
        code, _, _ = run(fake_admin, "unpin", "--gpus", "all")
        assert code == 0
        assert fake_admin.admin.pins == {}


class TestOtherCommands:
    def test_reset_defaults_to_all_gpus_and_reports_closed_sessions(
        self, fake_admin: FakeAdminServer
    ) -> None:
        """reset without --gpus resets every GPU and lists the sessions it closed."""
        result = run_json(fake_admin, "reset")
        request = fake_admin.admin.requests[-1]
        assert isinstance(request, eerl_pb2.ResetAllRequest)
        assert request.all
        assert result["closed_session_ids"] == [SESSION_ID[:8] + "…"]

    @pytest.mark.parametrize("command", ["sessions", "status", "decisions"])
    def test_session_tokens_are_printed_as_a_prefix_unless_asked(
        self, fake_admin: FakeAdminServer, command: str
    ) -> None:
        """A full session token is a credential: tables and JSON show 8 characters, --show-tokens all."""
        _, table, _ = run(fake_admin, command)
        _, json_out, _ = run(fake_admin, "--json", command)
        _, shown, _ = run(fake_admin, "--json", "--show-tokens", command)
        assert SESSION_ID not in table + json_out
        assert SESSION_ID[:8] in table
        assert SESSION_ID in shown

    def test_sessions_lists_open_sessions(self, fake_admin: FakeAdminServer) -> None:
        """sessions --json lists the one open session with its GPUs."""
        sessions = run_json(fake_admin, "sessions")["sessions"]
        assert [(s["job_id"], s["gpu_indices"]) for s in sessions] == [("job-42", [0])]

    def test_decisions_filter_by_a_session_prefix_and_the_phase(self, fake_admin: FakeAdminServer) -> None:
        """decisions --session PREFIX --phase training sends the phase filter and keeps that session's."""
        result = run_json(fake_admin, "decisions", "--session", SESSION_ID[:8] + "…", "--phase", "training")
        request = fake_admin.admin.requests[-1]
        assert isinstance(request, eerl_pb2.GetDecisionsRequest)
        assert request.kind == eerl_pb2.PHASE_KIND_TRAINING
        assert [d["session_id"] for d in result["decisions"]] == [SESSION_ID[:8] + "…"]

    def test_decisions_table_shows_the_reason(self, fake_admin: FakeAdminServer) -> None:
        """The decisions table carries the controller's reason in words."""
        _, out, _ = run(fake_admin, "decisions")
        assert "candidate 1410 MHz met 0.97 of predicted throughput" in out

    def test_an_unknown_session_is_an_error(self, fake_admin: FakeAdminServer) -> None:
        """decisions for an unknown session prints the daemon's NOT_FOUND message."""
        code, _, err = run(fake_admin, "decisions", "--session", "nope")
        assert (code, err) == (1, "Error: no decisions of a session whose id starts with 'nope'\n")

    def test_version_names_both_sides(self, fake_admin: FakeAdminServer) -> None:
        """version prints eerlctl's and eerld's versions."""
        code, out, _ = run(fake_admin, "version")
        assert code == 0
        assert out.startswith("eerlctl ")
        assert "eerld 0.1.0 (backend sim)" in out

    def test_version_without_a_daemon_still_names_the_client(self, sock_dir: Path) -> None:
        """version prints eerlctl's own version, then the Error line, when eerld is unreachable."""
        code, out, err = run(sock_dir / "absent.sock", "version")
        assert code == 1
        assert out.startswith("eerlctl ")
        assert err.startswith("Error: no eerld socket")

    def test_health_exits_zero_when_serving(self, fake_admin: FakeAdminServer) -> None:
        """health prints SERVING and exits 0."""
        assert run(fake_admin, "health")[:2] == (0, "SERVING\n")

    def test_health_exits_non_zero_when_not_serving(self, fake_admin: FakeAdminServer) -> None:
        """A NOT_SERVING daemon fails the probe."""
        fake_admin.health.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert run(fake_admin, "health")[:2] == (1, "NOT_SERVING\n")


class TestFailures:
    def test_a_missing_socket_is_one_helpful_line(self, sock_dir: Path) -> None:
        """No daemon: exit 1 and one Error line that says where it looked, no traceback."""
        code, out, err = run(sock_dir / "absent.sock", "status")
        assert (code, out) == (1, "")
        assert err == f"Error: no eerld socket at {sock_dir / 'absent.sock'}: is eerld running? " + (
            "(set --socket or EERLCTL_SOCKET)\n"
        )

    def test_debug_adds_the_traceback(self, sock_dir: Path) -> None:
        """With --debug the traceback precedes the Error line."""
        _, _, err = run(sock_dir / "absent.sock", "--debug", "status")
        assert "Traceback" in err
        assert err.splitlines()[-1].startswith("Error: ")

    def test_usage_errors_exit_two(self, capsys: pytest.CaptureFixture[str]) -> None:
        """An unknown command is a usage error (exit 2), like every argparse tool."""
        assert main(["frobnicate"]) == 2
        assert "invalid choice" in capsys.readouterr().err


class TestCompletion:
    def test_bash_completion_is_valid_bash(self, tmp_path: Path) -> None:
        """The bash script parses with bash -n and offers every command."""
        script = tmp_path / "eerlctl.bash"
        script.write_text(completion_script("bash"))
        subprocess.run(["bash", "-n", str(script)], check=True)
        assert all(name in script.read_text() for name in COMMANDS)

    def test_completion_command_prints_the_script(self) -> None:
        """eerlctl completion zsh prints a #compdef script."""
        out = io.StringIO()
        assert main(["completion", "zsh"], out=out, err=io.StringIO()) == 0
        assert out.getvalue().startswith("#compdef eerlctl")

    def test_bash_completion_completes_subcommand_options(self, tmp_path: Path) -> None:
        """Sourced in bash, completing `eerlctl pin --s` offers --show-tokens, --sm-mhz and --socket."""
        script = tmp_path / "eerlctl.bash"
        script.write_text(completion_script("bash"))
        probe = (
            f"source {script}; COMP_WORDS=(eerlctl pin --s); COMP_CWORD=2; _eerlctl; "
            'printf "%s\\n" "${COMPREPLY[@]}"'
        )
        done = subprocess.run(["bash", "-c", probe], check=True, capture_output=True, text=True)
        assert sorted(done.stdout.split()) == ["--show-tokens", "--sm-mhz", "--socket"]
