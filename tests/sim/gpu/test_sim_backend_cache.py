"""The sim backend's cached reads: a state file is parsed again, and a GPU advanced again, only as needed.

Whatever is cached, a read must see every change made before it, by this process or another one.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from eerl_sim import physics
from eerl_sim.gpu import create_sim_backend

from eerld.errors import GpuLost
from tests.sim.gpu.sim_fixtures import QUIET_H100, virtual_backend

REPO_ROOT = Path(__file__).resolve().parents[3]
SPEEDUP = 1000.0

CHILD = """
import sys
from pathlib import Path
from eerl_sim.gpu import SimBackend, open_sim_device
backend = SimBackend(open_sim_device(Path(sys.argv[1])))
for line in sys.stdin:
    backend.lock_sm_clock(0, int(line))
    print("done", flush=True)
"""


class TestFileCache:
    def test_every_change_another_process_makes_is_seen_by_the_next_read(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend = create_sim_backend(QUIET_H100, 1, speedup=SPEEDUP, state_file=path)
        assert backend.clocks(0).sm_clock_mhz == QUIET_H100.sm_clock_grid_mhz()[0]
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(path)],
            cwd=REPO_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdin is not None
        assert child.stdout is not None
        try:
            for clock_mhz in [1200, 1500, 1200, 1500, 1200, 1500]:  # files of the same size
                child.stdin.write(f"{clock_mhz}\n")
                child.stdin.flush()
                assert child.stdout.readline().strip() == "done"
                assert backend.device.observe(0).sm_lock_mhz == clock_mhz
        finally:
            child.stdin.close()
            child.wait(timeout=60)
            child.stdout.close()
        assert child.returncode == 0

    def test_two_backends_on_one_file_see_each_others_changes_at_once(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        first, clock = virtual_backend(state_file=path)
        second = create_sim_backend(QUIET_H100, 2, clock=clock, state_file=path)
        for round_ in range(40):
            writer, reader = (first, second) if round_ % 2 else (second, first)
            clock_mhz = 1200 if round_ % 4 < 2 else 1500
            writer.lock_sm_clock(round_ % 2, clock_mhz)
            assert reader.device.observe(round_ % 2).sm_lock_mhz == clock_mhz

    def test_a_write_keeps_what_another_backend_wrote_to_the_other_gpus(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        first, clock = virtual_backend(state_file=path)
        second = create_sim_backend(QUIET_H100, 2, clock=clock, state_file=path)
        first.lock_sm_clock(0, 1200)
        first.lock_sm_clock(1, 1200)
        second.lock_sm_clock(1, 1350)
        first.lock_sm_clock(0, 1500)
        fresh = create_sim_backend(QUIET_H100, 2, clock=clock, state_file=path)
        assert [fresh.device.observe(i).sm_lock_mhz for i in range(2)] == [1500, 1350]

    def test_a_file_replaced_from_outside_is_read_again(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend, _ = virtual_backend(state_file=path)
        saved = path.read_bytes()
        backend.lock_sm_clock(0, 1200)
        assert backend.device.observe(0).sm_lock_mhz == 1200
        path.with_name("copy").write_bytes(saved)
        path.with_name("copy").replace(path)
        assert backend.device.observe(0).sm_lock_mhz is None

    def test_a_read_does_not_wait_for_a_writer_holding_the_lock(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend, _ = virtual_backend(state_file=path)
        seen: list[int] = []
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            reader = threading.Thread(target=lambda: seen.append(backend.total_energy_mj(0)))
            reader.start()
            reader.join(timeout=30)
            assert not reader.is_alive()
        finally:
            os.close(fd)
        assert len(seen) == 1

    def test_durable_writes_still_store_the_state(self, tmp_path: Path) -> None:
        path = tmp_path / "gpus.json"
        backend, clock = virtual_backend(state_file=path)
        durable = create_sim_backend(QUIET_H100, 2, clock=clock, state_file=path, durable_writes=True)
        durable.lock_sm_clock(1, 1350)
        assert backend.device.observe(1).sm_lock_mhz == 1350


class TestReadViews:
    def test_reads_between_changes_give_the_energy_of_reads_after_them(self) -> None:
        def run(read_between: bool) -> list[float]:
            backend, clock = virtual_backend()
            backend.device.submit_segments(0, np.linspace(10, 900, 300), np.full(300, 0.002))
            seen = []
            for step in range(60):
                clock.advance(0.05)
                if read_between:
                    backend.power_w(0)
                    backend.total_energy_mj(0)
                if step % 7 == 0:
                    backend.lock_sm_clock(0, 1200 if step % 14 else 1500)
                    seen.append(backend.true_energy_j(0))
            return [*seen, backend.true_energy_j(0)]

        assert run(True) == pytest.approx(run(False), rel=1e-12)

    def test_a_copy_returned_by_observe_can_be_changed_without_changing_the_device(self) -> None:
        backend, clock = virtual_backend()
        backend.device.submit_segments(0, [600.0, 600.0], [0.0, 0.0])
        clock.advance(0.1)
        observed = backend.device.observe(0)
        observed.marks.clear()
        observed.energy_j = 0.0
        observed.sm_lock_mhz = 1200
        assert backend.true_energy_j(0) > 0
        assert backend.device.observe(0).sm_lock_mhz is None
        assert backend.device.observe(0).marks

    def test_power_and_utilisation_over_many_short_segments_are_their_means(self) -> None:
        backend, clock = virtual_backend()
        backend.lock_sm_clock(0, 1200)
        clock.advance(1.0)
        segments = 600  # 0.5 ms each: about 200 of them in the 100 ms window
        backend.device.submit_segments(0, np.full(segments, 0.4), np.full(segments, 0.0005))
        clock.advance(0.2)
        duration_s = physics.segment_duration_s(0.4, 0.0005, 1200.0)
        assert backend.power_w(0) == pytest.approx(physics.segment_power_w(QUIET_H100, 0.4, 0.0005, 1200.0))
        assert backend.utilization(0).gpu_percent == 100
        assert backend.utilization(0).memory_percent == round(100 * 0.0005 / duration_s)

    def test_the_energy_counter_read_from_many_threads_never_goes_back(self, tmp_path: Path) -> None:
        backend = create_sim_backend(QUIET_H100, 1, speedup=SPEEDUP, state_file=tmp_path / "gpus.json")
        backend.device.submit_segments(0, np.full(400, 50.0), np.full(400, 0.001))
        readings: list[list[int]] = [[] for _ in range(3)]

        def read(out: list[int]) -> None:
            for _ in range(150):
                out.append(backend.total_energy_mj(0))

        threads = [threading.Thread(target=read, args=(out,)) for out in readings]
        for thread in threads:
            thread.start()
        for clock_mhz in [1200, 1500] * 10:
            backend.lock_sm_clock(0, clock_mhz)
        for thread in threads:
            thread.join()
        for out in readings:
            assert out == sorted(out)
            assert out[-1] > out[0]

    def test_the_counter_read_without_advancing_equals_the_full_read_at_every_time(self) -> None:
        backend, clock = virtual_backend()
        device = backend.device
        device.submit_segments(0, np.linspace(10, 900, 200), np.full(200, 0.002))
        shortcut_hits = 0
        for step in range(400):
            # Steps of 13 ms against the counter's 100 ms: reads on both sides of every step, some at it.
            clock.advance(0.013 if step % 9 else 0.1 - clock.now_s() % 0.1)
            if step % 5 == 0:
                backend.lock_sm_clock(0, 1200 if step % 10 else 1500)
            stored = device.store.load()
            assert stored is not None
            shortcut_hits += device.model.counter_step_s(clock.now_s()) <= stored.gpus[0].time_s
            assert backend.total_energy_mj(0) == device.read(0, None, device.model.counter_mj)
        assert 50 < shortcut_hits < 350  # both paths were taken

    def test_a_fault_on_the_counter_still_fires_when_the_read_needs_no_advance(self) -> None:
        backend, _clock = virtual_backend()
        backend.lock_sm_clock(0, 1200)
        backend.inject_fault(0, "total_energy_mj", GpuLost, once=True)
        with pytest.raises(GpuLost):
            backend.total_energy_mj(0)
        # the once-fault is spent: the next read answers, with what the full read gives
        assert backend.total_energy_mj(0) == backend.device.read(0, None, backend.device.model.counter_mj)
