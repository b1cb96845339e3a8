"""The sim backend's shared device: a state file used by several backends, threads and processes."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest
from eerl_sim import physics
from eerl_sim.gpu import RealTimeClock, VirtualClock, create_sim_backend, open_sim_device

from eerld.errors import BackendFailure, ConfigError, GpuLost
from tests.sim.gpu.sim_fixtures import H100, HEAVY_COMPUTE_MHZ_S, QUIET_H100, virtual_backend

REPO_ROOT = Path(__file__).resolve().parents[3]
SPEEDUP = 1000.0


def run_child(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run a Python snippet in a fresh interpreter (a different process sharing the state file)."""
    return subprocess.run(
        [sys.executable, "-c", script, *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class TestStateFile:
    def test_a_missing_state_file_starts_a_fresh_device_in_a_private_file(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend, _ = virtual_backend(state_file=path)
        assert backend.clocks(0).sm_clock_mhz == 345
        assert json.loads(path.read_text())["format"] == "eerl-sim-device"
        assert path.stat().st_mode & 0o777 == 0o600
        assert sorted(p.name for p in tmp_path.iterdir()) == ["gpus.json", "gpus.json.lock"]

    def test_a_second_backend_on_the_same_file_sees_locks_faults_and_counters(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        clock = VirtualClock()
        first = create_sim_backend(QUIET_H100, 2, clock=clock, state_file=path)
        first.lock_sm_clock(1, 1200)
        first.lose_gpu(0)
        clock.advance(1.0)
        second = create_sim_backend(QUIET_H100, 2, clock=clock, state_file=path)
        assert second.clocks(1).sm_clock_mhz == 1200
        assert second.total_energy_mj(1) == first.total_energy_mj(1)
        with pytest.raises(GpuLost):
            second.power_w(0)

    def test_concurrent_changes_from_threads_are_never_lost(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend = create_sim_backend(
            QUIET_H100, 4, clock=VirtualClock(), state_file=path, durable_writes=False
        )
        clocks = [900, 1050, 1200, 1350]

        def churn(index: int) -> None:
            for _ in range(15):
                backend.lock_sm_clock(index, 1980)
                backend.lock_sm_clock(index, clocks[index])

        threads = [threading.Thread(target=churn, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert [backend.device.observe(i).sm_lock_mhz for i in range(4)] == clocks

    @pytest.mark.parametrize(
        "content",
        [b"", b"{not json", b'{"format": "something-else"}', b'{"format": "eerl-sim-device", "version": 99}'],
    )
    def test_a_corrupt_state_file_is_a_config_error_naming_the_file(
        self, tmp_path: Path, content: bytes
    ) -> None:
        path = tmp_path / "gpus.json"
        path.write_bytes(content)
        with pytest.raises(ConfigError, match=str(path)):
            virtual_backend(state_file=path)
        assert path.read_bytes() == content

    @pytest.mark.parametrize(
        ("where", "value", "field"),
        [
            (("clock", "kind"), 5, "clock.kind"),
            (("clock", "speedup"), "fast", "clock.speedup"),
            (("clock", "epoch_monotonic_s"), "x", "clock.epoch_monotonic_s"),
            (("clock", "boot_id"), 7, "clock.boot_id"),
            (("clock",), None, "clock"),
            (("gpus", 0, "time_s"), "x", "gpus[0].time_s"),
            (("gpus", 0, "energy_j"), float("inf"), "gpus[0].energy_j"),
            (("gpus", 0, "head_seq"), 2.5, "gpus[0].head_seq"),
            (("gpus", 0, "lost"), "no", "gpus[0].lost"),
            (("gpus", 0, "head"), dict.fromkeys(("start_s", "duration_s", "power_w"), "x"), "gpus[0].head"),
            (("gpus", 0, "marks"), {"m": "xyz"}, "gpus[0].marks.m"),
            (
                ("gpus", 0, "faults"),
                {"clocks": {"error": "Nope", "once": True}},
                "gpus[0].faults.clocks.error",
            ),
            (
                ("gpus", 0, "faults"),
                {"clocks": {"error": "GpuLost", "once": "yes"}},
                "gpus[0].faults.clocks.once",
            ),
            (("gpus", 0, "pending"), [1, 2], "gpus[0].pending"),
        ],
    )
    def test_a_state_file_field_of_the_wrong_type_is_one_config_error_naming_the_file_and_the_field(
        self, tmp_path: Path, where: tuple[str | int, ...], value: object, field: str
    ) -> None:
        path = tmp_path / "gpus.json"
        virtual_backend(state_file=path)[0].close()
        doc = json.loads(path.read_text())
        node = doc
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
        path.write_text(json.dumps(doc))
        with pytest.raises(ConfigError, match=str(path)) as raised:
            virtual_backend(state_file=path)
        assert field in str(raised.value)

    def test_a_state_file_damaged_while_in_use_makes_calls_fail_as_backend_failures(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "gpus.json"
        backend, _ = virtual_backend(state_file=path)
        raw = json.loads(path.read_text())
        raw["gpus"][0]["queue"] = {"rows": 3, "f8le": ""}
        path.write_text(json.dumps(raw))
        with pytest.raises(BackendFailure, match="corrupt"):
            backend.total_energy_mj(0)

    def test_a_state_file_of_another_device_is_refused_with_what_differs(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        virtual_backend(state_file=path, gpus=2, seed=1)
        with pytest.raises(ConfigError, match="power_limit_w"):
            virtual_backend(replace(QUIET_H100, power_limit_w=650), state_file=path, gpus=2, seed=1)
        with pytest.raises(ConfigError, match="has 2 GPUs, not 3"):
            virtual_backend(state_file=path, gpus=3, seed=1)
        with pytest.raises(ConfigError, match="seed"):
            virtual_backend(state_file=path, gpus=2, seed=2)

    def test_a_real_time_state_file_needs_the_same_speedup(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        create_sim_backend(QUIET_H100, 1, speedup=10, state_file=path)
        with pytest.raises(ConfigError, match="speedup"):
            create_sim_backend(QUIET_H100, 1, speedup=20, state_file=path)
        with pytest.raises(ConfigError, match="virtual"):
            create_sim_backend(QUIET_H100, 1, clock=VirtualClock(), state_file=path)

    def test_a_state_file_from_before_a_reboot_starts_a_fresh_device(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend = create_sim_backend(QUIET_H100, 1, speedup=SPEEDUP, state_file=path)
        backend.lock_sm_clock(0, 1200)
        raw = json.loads(path.read_text())
        raw["clock"]["boot_id"] = "another-boot"
        path.write_text(json.dumps(raw))
        again = create_sim_backend(QUIET_H100, 1, speedup=SPEEDUP, state_file=path)
        assert again.device.observe(0).sm_lock_mhz is None

    def test_joining_a_missing_state_file_is_a_config_error(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="does not exist"):
            open_sim_device(tmp_path / "nothing.json")

    def test_bad_device_parameters_are_config_errors(self) -> None:
        with pytest.raises(ConfigError):
            create_sim_backend(QUIET_H100, 0, clock=VirtualClock())
        with pytest.raises(ConfigError):
            RealTimeClock(0)


class TestProcesses:
    def test_another_process_sees_this_ones_lock_and_this_one_sees_its_work_and_lock(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "gpus.json"
        backend = create_sim_backend(QUIET_H100, 2, speedup=SPEEDUP, state_file=path)
        backend.lock_sm_clock(0, 1200)
        energy_before_j = backend.true_energy_j(0)
        counter_before_mj = backend.total_energy_mj(0)
        child = run_child(
            """
import json, sys
from pathlib import Path
from eerl_sim.gpu import SimBackend, open_sim_device
device = open_sim_device(Path(sys.argv[1]))
backend = SimBackend(device)
backend.lock_sm_clock(1, 1500)
result = device.run_segments(0, [600.0, 600.0], [0.0, 0.0])
print(json.dumps({"lock": device.observe(0).sm_lock_mhz, "duration_s": result.duration_s,
                  "energy_j": result.energy_j}))
""",
            str(path),
        )
        assert child.returncode == 0, child.stderr
        seen = json.loads(child.stdout)
        assert seen["lock"] == 1200
        assert seen["duration_s"] == pytest.approx(2 * physics.segment_duration_s(600.0, 0.0, 1200.0))
        assert backend.true_energy_j(0) - energy_before_j >= seen["energy_j"]
        assert backend.total_energy_mj(0) > counter_before_mj
        assert backend.clocks(1).sm_clock_mhz == 1500

    def test_locks_and_counters_outlive_a_killed_backend_process(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        child = run_child(
            """
import os, signal, sys
from pathlib import Path
from eerl_sim.gpu import create_sim_backend
from eerl_sim.profiles import builtin_profile
backend = create_sim_backend(builtin_profile("h100-sxm"), 2, speedup=float(sys.argv[2]),
                             state_file=Path(sys.argv[1]))
backend.lock_sm_clock(1, 1110)
backend.device.run_segments(1, [300.0], [0.0])
print(backend.total_energy_mj(1), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
""",
            str(path),
            str(SPEEDUP),
        )
        assert child.returncode == -signal.SIGKILL
        counter_at_death = int(child.stdout)
        backend = create_sim_backend(H100, 2, speedup=SPEEDUP, state_file=path)
        assert backend.clocks(1).sm_clock_mhz == 1110
        assert backend.total_energy_mj(1) >= counter_at_death


class TestRealTime:
    def test_real_time_work_waits_about_its_simulated_duration(self) -> None:
        backend = create_sim_backend(QUIET_H100, 1, speedup=SPEEDUP)
        clock = backend.device.clock
        before_s = clock.now_s()
        result = backend.device.run_segments(0, [HEAVY_COMPUTE_MHZ_S] * 3, [0.0] * 3)
        assert result.final
        assert result.start_s >= before_s
        assert clock.now_s() >= result.end_s > result.start_s

    def test_real_time_clocks_of_several_processes_agree_through_the_epoch(self) -> None:
        clock = RealTimeClock(50.0)
        twin = RealTimeClock(50.0).with_epoch(clock.epoch_monotonic_s)
        first = clock.now_s()
        second = twin.now_s()
        third = clock.now_s()
        assert first <= second <= third
