"""A job written in shell (bash + curl, no Python) drives its phases through eerl-sidecar, against a real
eerld on the sim backend; the sidecar is SIGKILLed mid-phase; the daemon is absent. Every process is real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.sidecar.conftest import (
    GENERATION_MHZ,
    TRAINING_MHZ,
    SidecarProcess,
    SimEerld,
    parse_job_output,
    run_job,
    sidecar_for,
    start_job,
    wait_until,
)

RESET_WITHIN_S = 2.0


@pytest.mark.usefixtures("curl")
class TestShellJob:
    def test_the_daemon_meters_every_phase_the_shell_job_reports(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "shell-job")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        calls, finished, code = run_job(sidecar.url, env={"ITERATIONS": "4", "WORK_S": "0.2"})
        assert code == 0
        assert finished
        assert [c.code for c in calls] == [200] * 16
        begins = [c for c in calls if c.edge == "begin"]
        ends = [c for c in calls if c.edge == "end"]
        # Each begin says the clock the daemon applied; each end what it metered.
        for call in begins:
            expected = GENERATION_MHZ if call.kind == "generation" else TRAINING_MHZ
            assert call.answer["clock"] == "locked", call
            assert call.answer["sm_clock_mhz"] == expected
            assert {gpu["sm_clock_mhz"] for gpu in call.answer["gpus"]} == {expected}
            assert call.answer["state"] == "fixed"
        for call in ends:
            assert call.answer["metered"] is True, call
            assert call.answer["duration_s"] > 0.19
            assert call.answer["energy_j"] >= 0
            assert call.answer["gpus"] == 2
        assert sum(c.answer["energy_j"] for c in ends) > 0  # the sim's counter steps: a phase may see none
        # The daemon's own account (admin socket): every phase metered, none lost.
        assert eerld_sim.metered("shell-job") == {"PHASE_KIND_GENERATION": 4, "PHASE_KIND_TRAINING": 4}
        status = sidecar.status()
        assert status["phases"]["generation"]["metered"] == 4
        assert status["phases"]["training"]["metered"] == 4
        assert status["open_phases"] == []
        assert status["client"]["sent_events"] == 16

    def test_a_sidecar_on_a_unix_socket_serves_the_same_job(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        path = sock_dir / "sidecar.sock"
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "unix-job", listen=f"unix:{path}")
        assert sidecar.url == f"unix:{path}"
        assert oct(path.stat().st_mode & 0o777) == "0o600"
        wait_until("the sidecar's session", lambda: eerld_sim.session_of("unix-job") is not None)
        calls, finished, _ = run_job(sidecar.url, env={"ITERATIONS": "2"})
        assert finished
        assert [c.code for c in calls] == [200] * 8
        assert eerld_sim.metered("unix-job") == {"PHASE_KIND_GENERATION": 2, "PHASE_KIND_TRAINING": 2}
        sidecar.stop()
        assert not path.exists()

    def test_sigkill_mid_phase_resets_the_gpus_within_2_s_and_the_job_goes_on(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess], tmp_path: Path
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "kill-job")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        hold = tmp_path / "go-on"
        job = start_job(sidecar.url, env={"ITERATIONS": "3", "HOLD_AT": "1", "HOLD_FILE": str(hold)})
        wait_until(
            "the generation phase of iteration 1",
            lambda: (
                [(p["kind"], p["iteration"]) for p in sidecar.status()["open_phases"]] == [("generation", 1)]
            ),
        )
        assert eerld_sim.locks() == [GENERATION_MHZ, GENERATION_MHZ]
        sidecar.kill()  # SIGKILL: no goodbye, only the Attach stream ends
        # The GPUs are reset before the session is forgotten (eerld.daemon.core: release, then unlist): both
        # within the bound, in that order, so wait for both.
        wait_until(
            "the GPUs back at default and the session gone",
            lambda: eerld_sim.locks() == [None, None] and eerld_sim.session_of("kill-job") is None,
            RESET_WITHIN_S,
        )
        hold.touch()
        out, _ = job.communicate(timeout=60)
        calls, finished = parse_job_output(out)
        assert job.returncode == 0
        assert finished
        assert len(calls) == 12
        assert [c.code for c in calls[:5]] == [200] * 5  # up to the begin of generation 1
        assert [c.code for c in calls[5:]] == [0] * 7  # no sidecar: curl's 000, and on it goes

    def test_with_the_daemon_absent_every_call_answers_at_once_and_the_job_ends(
        self, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        sidecar = sidecar_for(
            start_sidecar,
            sock_dir / "no-eerld.sock",
            "lonely-job",
            # Far beyond job.sh's curl --max-time 1: a call that waited for the daemon would come back
            # as curl's 000, so 20 answers of 200 say that none waited.
            "--answer-timeout-s",
            "30",
            gpus="0",
        )
        calls, finished, code = run_job(sidecar.url, env={"ITERATIONS": "5", "WORK_S": "0"})
        assert code == 0
        assert finished
        assert [c.code for c in calls] == [200] * 20
        assert all(c.answer["connected"] is False for c in calls)
        assert all(c.answer["clock"] == "unknown" for c in calls)
        assert all(c.answer["metered"] is False for c in calls if c.edge == "end")
        status = sidecar.status()
        assert status["connected"] is False
        assert status["open_phases"] == []


class TestPhaseCli:
    """``eerl phase begin|end``: the CLI over the same API, fail-open."""

    def cli(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        environment = {k: v for k, v in os.environ.items() if k != "EERL_SIDECAR"}
        environment.update(env or {})
        return subprocess.run(
            [sys.executable, "-m", "eerl.cli", *args],
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )

    def test_phases_through_the_cli_are_metered(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "cli-job")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        env = {"EERL_SIDECAR": sidecar.url}
        begun = self.cli("phase", "begin", "generation", "--iteration", "0", "--json", env=env)
        assert begun.returncode == 0, begun.stderr
        assert '"sm_clock_mhz":1200' in begun.stdout
        ended = self.cli(
            "phase", "end", "generation", "-i", "0", "--tokens", "100", "--sequences", "2", "--json", env=env
        )
        assert ended.returncode == 0
        assert '"metered":true' in ended.stdout
        assert self.cli("phase", "begin", "train", env=env).stdout == ""  # quiet without --json
        assert (
            self.cli("phase", "end", "training", "--tokens", "10", "--valid-tokens", "5", env=env).returncode
            == 0
        )
        assert eerld_sim.metered("cli-job") == {"PHASE_KIND_GENERATION": 1, "PHASE_KIND_TRAINING": 1}
        shown = self.cli("status", env=env)  # for people without --json (#37), the JSON with it
        assert shown.returncode == 0, shown.stderr
        assert shown.stdout.startswith("job cli-job on GPUs ")
        assert "connected to eerld" in shown.stdout
        assert "  generation: " in shown.stdout
        assert "1 phases metered" in shown.stdout
        assert json.loads(self.cli("status", "--json", env=env).stdout)["job_id"] == "cli-job"

    def test_refused_events_exit_0_with_a_line_unless_strict(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "cli-refused")
        env = {"EERL_SIDECAR": sidecar.url}
        loose = self.cli("phase", "end", "generation", "--tokens", "-5", env=env)
        assert loose.returncode == 0
        assert "tokens: -5 is negative" in loose.stderr
        strict = self.cli("phase", "begin", "decoding", "--strict", env=env)
        assert strict.returncode == 1
        assert "kind: 'decoding' is not" in strict.stderr

    def test_without_a_sidecar_it_exits_0_at_once_unless_strict(self, sock_dir: Path) -> None:
        nowhere = {"EERL_SIDECAR": f"unix:{sock_dir / 'none.sock'}"}
        quiet = self.cli("phase", "begin", "generation", "-i", "1")  # the default address: not deployed
        loose = self.cli("phase", "begin", "generation", "-i", "1", env=nowhere)
        strict = self.cli("phase", "begin", "generation", "-i", "1", "--strict", env=nowhere)
        assert (quiet.returncode, loose.returncode, strict.returncode) == (0, 0, 1)
        assert quiet.stderr == ""
        assert "cannot reach the sidecar" in loose.stderr
        disabled = self.cli("phase", "begin", "generation", "--strict", env={**nowhere, "EERL_DISABLE": "1"})
        assert disabled.returncode == 0
        assert disabled.stderr == ""

    def test_a_usage_error_exits_2(self) -> None:
        assert self.cli("phase", "end", "generation", "--tokens", "many").returncode == 2
