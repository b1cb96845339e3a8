"""perf.kernel_mix without a GPU: a kernel mix is measured with reads only, and written as a stage profile
that eerl-sim's reader of the measured sweeps reads back."""

from __future__ import annotations

from pathlib import Path

import pytest
from eerl_sim.measured import STAGE_PROFILE_COLUMNS, parse_stage_profile

from eerld.gpu.base import GpuClocks
from perf import kernel_mix
from perf.kernel_mix import MixRecord, measure_mix, write_stage_profile


class ReadOnlyFake:
    """A GPU whose energy counter advances 300 J per read while a mix runs, at 1755 MHz; it records every
    call, and has no method that could change a clock."""

    def __init__(self) -> None:
        self.energy_mj = 5_000_000
        self.calls: list[str] = []

    def total_energy_mj(self, index: int) -> int:
        self.calls.append("total_energy_mj")
        self.energy_mj += 300_000
        return self.energy_mj

    def clocks(self, index: int) -> GpuClocks:
        self.calls.append("clocks")
        return GpuClocks(sm_clock_mhz=1755, mem_clock_mhz=2619)

    def power_w(self, index: int) -> float:
        self.calls.append("power_w")
        return 420.0


class TestKernelMix:
    def test_a_mix_is_measured_between_two_counter_reads_at_the_clock_the_governor_held(self) -> None:
        gpu = ReadOnlyFake()
        record = measure_mix(gpu, "decode", lambda: None)
        assert record.instruction == "decode"
        assert record.sm_clock_mhz == 1755
        assert record.energy_j == pytest.approx(300.0)
        assert record.power_w == pytest.approx(300.0 / record.time_s)
        assert set(gpu.calls) <= {"total_energy_mj", "clocks", "power_w"}

    def test_the_writer_speaks_the_format_of_the_shipped_sweeps(self, tmp_path: Path) -> None:
        records = [MixRecord("decode", 1755, 2.01, 702.5), MixRecord("training", 1590, 1.98, 1346.4)]
        path = tmp_path / "kernel_mix.csv"
        write_stage_profile(records, path)
        text = path.read_text()
        assert text.splitlines()[0] == ",".join(STAGE_PROFILE_COLUMNS)
        assert kernel_mix.STAGE_PROFILE_COLUMNS == STAGE_PROFILE_COLUMNS
        curves = parse_stage_profile(text, source=str(path))
        assert [(c.instruction, c.sm_clocks_mhz, c.time_s, c.energy_j) for c in curves] == [
            ("decode", (1755,), (2.01,), (702.5,)),
            ("training", (1590,), (1.98,), (1346.4,)),
        ]

    def test_a_run_is_sized_from_the_step_rate_after_a_warm_up(self) -> None:
        calls: list[str] = []
        step, sync = (lambda: calls.append("step")), (lambda: calls.append("sync"))
        rate = kernel_mix.steps_per_second(step, sync, steps=5)
        assert calls == ["step"] * 3 + ["sync"] + ["step"] * 5 + ["sync"]
        assert rate > 0
