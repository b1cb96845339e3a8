"""Background energy sampling: phase events read a fresh estimate at once, never a false counter reset."""

from __future__ import annotations

import sys
import time

import pytest

from eerld.app import create_backend
from eerld.config import load_config
from eerld.errors import GpuLost
from eerld.gpu.delegating import DelegatingBackend
from eerld.gpu.energy_sampler import EnergySample, SampledEnergyBackend, estimate_energy_mj
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.gpu.fake_pynvml import FakePynvml, make_gpus


class CountingBackend(DelegatingBackend):
    """Counts energy reads and can be told to report a given counter value or fail."""

    def __init__(self, inner: FakeGpuBackend) -> None:
        super().__init__(inner)
        self.energy_reads = 0
        self.override_mj: int | None = None
        self.failing = False

    def total_energy_mj(self, index: int) -> int:
        self.energy_reads += 1
        if self.failing:
            raise GpuLost("fell off the bus", gpu_index=index)
        return self.override_mj if self.override_mj is not None else super().total_energy_mj(index)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def counting(clock: ManualClock) -> CountingBackend:
    return CountingBackend(FakeGpuBackend(gpus=2, clock=clock))


def sampled(counting: CountingBackend, clock: ManualClock) -> SampledEnergyBackend:
    return SampledEnergyBackend(counting, period_s=0.02, clock=clock, start=False)


class TestEstimate:
    def test_constant_power_is_extrapolated_exactly(self) -> None:
        samples = [EnergySample(t / 10, 1000 + 50 * t) for t in range(4)]  # 500 mJ/s
        assert estimate_energy_mj(samples, 0.5) == 1250

    def test_only_samples_since_a_counter_restart_count(self) -> None:
        samples = [
            EnergySample(0.0, 9000),
            EnergySample(0.1, 9900),
            EnergySample(0.2, 10),
            EnergySample(0.3, 60),
        ]
        assert estimate_energy_mj(samples, 0.4) == 110

    def test_without_a_slope_the_newest_value_is_the_estimate(self) -> None:
        assert estimate_energy_mj([], 1.0) is None
        assert estimate_energy_mj([EnergySample(0.0, 7)], 1.0) == 7
        assert estimate_energy_mj([EnergySample(0.0, 7), EnergySample(0.1, 9)], 0.05) == 9


class TestSampledBackend:
    def test_a_phase_read_between_samples_costs_no_counter_read_and_matches_the_truth(
        self, counting: CountingBackend, clock: ManualClock
    ) -> None:
        """Two reads bracketing a phase give its energy within one sampling period's worth, no NVML call."""
        backend = sampled(counting, clock)
        truth = counting._inner  # the fake counts energy exactly

        def sample_for(seconds: float) -> None:
            for _ in range(round(seconds / 0.02)):
                clock.advance(0.02)
                backend.sample(0)

        sample_for(0.2)
        clock.advance(0.007)
        reads = counting.energy_reads
        begin, begin_truth = backend.total_energy_mj(0), truth.total_energy_mj(0)
        sample_for(1.0)
        clock.advance(0.013)
        end, end_truth = backend.total_energy_mj(0), truth.total_energy_mj(0)
        assert counting.energy_reads == reads + 50  # the samples only, none for the two phase reads
        power_mj_per_s = (end_truth - begin_truth) / 1.02
        assert abs((end - begin) - (end_truth - begin_truth)) <= power_mj_per_s * 0.02

    def test_a_counter_that_advances_in_steps_is_dated_by_its_changes(
        self, counting: CountingBackend, clock: ManualClock
    ) -> None:
        """A counter updated every 100 ms, sampled every 20 ms: the estimate beats the raw (stale) value."""
        backend = sampled(counting, clock)
        power_mj_per_s = 500_000.0  # 500 W

        def counter_at(t: float) -> int:
            return int(power_mj_per_s * (t // 0.1) * 0.1)

        errors_estimate, errors_raw = [], []
        for step in range(1, 200):
            t = step * 0.02
            if step > 30 and step % 7 == 0:  # a phase event 11 ms before this step's sample
                clock.advance(0.009)
                now_true = power_mj_per_s * (t - 0.011)
                errors_estimate.append(abs(backend.total_energy_mj(0) - now_true))
                errors_raw.append(abs(counter_at(t - 0.011) - now_true))
                clock.advance(0.011)
            else:
                clock.advance(0.02)
            counting.override_mj = counter_at(t)
            backend.sample(0)
        assert max(errors_estimate) <= power_mj_per_s * 0.025
        assert max(errors_estimate) < max(errors_raw)

    def test_right_after_start_the_extrapolation_runs_at_the_true_power(
        self, counting: CountingBackend, clock: ManualClock
    ) -> None:
        """With only the first two samples, the estimate is off by at most half a sampling period's energy."""
        backend = sampled(counting, clock)  # its first sample is taken at creation
        clock.advance(0.02)
        backend.sample(0)
        clock.advance(0.01)
        power_mj_per_s = counting._inner.power_at(0) * 1000.0
        truth = counting._inner.total_energy_mj(0)
        assert abs(backend.total_energy_mj(0) - truth) <= power_mj_per_s * 0.015

    def test_answers_never_go_backwards_without_a_counter_restart(
        self, counting: CountingBackend, clock: ManualClock
    ) -> None:
        backend = sampled(counting, clock)
        counting.override_mj = 0
        for step in range(1, 6):  # a steep rise, then a flat counter: the extrapolation overshoots
            clock.advance(0.02)
            counting.override_mj = 1000 * step
            backend.sample(0)
        clock.advance(0.04)
        high = backend.total_energy_mj(0)
        assert high > 5000
        clock.advance(0.001)
        counting.override_mj = 5000
        backend.sample(0)
        assert backend.total_energy_mj(0) >= high

    def test_a_counter_restart_shows_through(self, counting: CountingBackend, clock: ManualClock) -> None:
        backend = sampled(counting, clock)
        counting.override_mj = 10_000
        clock.advance(0.02)
        backend.sample(0)
        assert backend.total_energy_mj(0) >= 10_000
        counting.override_mj = 40
        clock.advance(0.02)
        backend.sample(0)
        assert backend.total_energy_mj(0) == 40

    def test_a_stale_sample_falls_back_to_a_direct_read(
        self, counting: CountingBackend, clock: ManualClock
    ) -> None:
        backend = sampled(counting, clock)
        clock.advance(5.0)
        reads = counting.energy_reads
        backend.total_energy_mj(1)
        assert counting.energy_reads == reads + 1

    def test_a_failing_counter_fails_the_read_once_its_samples_are_stale(
        self, counting: CountingBackend, clock: ManualClock
    ) -> None:
        backend = sampled(counting, clock)
        counting.failing = True
        backend.sample(0)  # a failed sample is no sample
        clock.advance(5.0)
        with pytest.raises(GpuLost):
            backend.total_energy_mj(0)

    def test_the_threads_sample_until_closed(self, counting: CountingBackend) -> None:
        backend = SampledEnergyBackend(counting, period_s=0.005)
        deadline = time.monotonic() + 10.0
        while counting.energy_reads < 8 and time.monotonic() < deadline:
            time.sleep(0.01)
        backend.close()
        assert counting.energy_reads >= 8
        reads = counting.energy_reads
        time.sleep(0.05)
        assert counting.energy_reads == reads

    def test_a_non_positive_period_is_refused(self, counting: CountingBackend) -> None:
        with pytest.raises(ValueError, match="period_s"):
            SampledEnergyBackend(counting, period_s=0.0, start=False)


class TestWiring:
    def test_the_nvml_backend_is_sampled_by_default_and_not_with_zero(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", FakePynvml(make_gpus(2)))
        backend = create_backend(load_config(["--backend", "nvml"]))
        try:
            assert isinstance(backend, SampledEnergyBackend)
            assert backend.total_energy_mj(1) >= 0
        finally:
            backend.close()
        direct = create_backend(load_config(["--backend", "nvml", "--energy-sample-ms", "0"]))
        assert not isinstance(direct, SampledEnergyBackend)
        direct.close()

    def test_the_sim_backend_is_never_sampled(self) -> None:
        backend = create_backend(load_config(["--backend", "sim", "--sim-gpus", "1"]))
        assert not isinstance(backend, SampledEnergyBackend)
        backend.close()
