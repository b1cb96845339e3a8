"""The sim backend in one process on virtual time: protocol, GPU model, measurement, validation, faults."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from eerl_sim import physics
from eerl_sim.gpu import FAULTABLE_METHODS, SimBackend, VirtualClock, create_sim_backend
from eerl_sim.gpu import model as sim_model
from eerl_sim.gpu.store import decode_state, encode_state
from eerl_sim.profiles import builtin_profile

from eerld.errors import (
    BackendFailure,
    GpuError,
    GpuLost,
    InvalidArgument,
    NoPermission,
    NotSupported,
)
from eerld.gpu.base import ClockEventReasons, GpuBackend
from tests.sim.gpu.sim_fixtures import (
    H100,
    HEAVY_COMPUTE_MHZ_S,
    HEAVY_MEMORY_S,
    LIGHT_COMPUTE_MHZ_S,
    LIGHT_MEMORY_S,
    QUIET_H100,
    power_limited_clock_mhz,
    segment_energy_j,
    virtual_backend,
)

UUID_FORMAT = re.compile(r"^GPU-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def heavy(backend: SimBackend, gpu: int = 0, count: int = 1) -> None:
    """Queue compute-bound segments on ``gpu`` without waiting."""
    backend.device.submit_segments(gpu, [HEAVY_COMPUTE_MHZ_S] * count, [HEAVY_MEMORY_S] * count)


# Every backend method that takes a GPU index, with valid arguments.
INDEXED_CALLS: dict[str, Callable[[SimBackend, int], Any]] = {
    "supported_sm_clocks_mhz": lambda b, i: b.supported_sm_clocks_mhz(i),
    "supported_mem_clocks_mhz": lambda b, i: b.supported_mem_clocks_mhz(i),
    "clocks": lambda b, i: b.clocks(i),
    "supports_locked_clocks": lambda b, i: b.supports_locked_clocks(i),
    "lock_sm_clock": lambda b, i: b.lock_sm_clock(i, 1200),
    "reset_sm_clock": lambda b, i: b.reset_sm_clock(i),
    "lock_mem_clock": lambda b, i: b.lock_mem_clock(i, 2619),
    "reset_mem_clock": lambda b, i: b.reset_mem_clock(i),
    "set_application_clocks": lambda b, i: b.set_application_clocks(i, 2619, 1200),
    "reset_application_clocks": lambda b, i: b.reset_application_clocks(i),
    "total_energy_mj": lambda b, i: b.total_energy_mj(i),
    "power_w": lambda b, i: b.power_w(i),
    "power_limit_w": lambda b, i: b.power_limit_w(i),
    "utilization": lambda b, i: b.utilization(i),
    "clock_event_reasons": lambda b, i: b.clock_event_reasons(i),
    "run_segments": lambda b, i: b.device.run_segments(i, [1.0], [0.001]),
}


class TestProtocol:
    def test_the_backend_implements_the_gpu_backend_protocol(self) -> None:
        backend, _ = virtual_backend()
        assert isinstance(backend, GpuBackend)
        assert backend.name == "sim"

    def test_every_indexed_protocol_method_can_take_a_fault(self) -> None:
        protocol_methods = {name for name in dir(GpuBackend) if not name.startswith("_")}
        assert protocol_methods - {"name", "inventory", "own_clock", "close"} == set(INDEXED_CALLS) - {
            "run_segments"
        }
        assert set(INDEXED_CALLS) | {"inventory"} == FAULTABLE_METHODS

    def test_inventory_lists_each_gpu_with_an_nvml_style_uuid_the_product_name_and_a_bus_id(self) -> None:
        backend, _ = virtual_backend(gpus=8)
        gpus = backend.inventory()
        assert [g.index for g in gpus] == list(range(8))
        assert all(UUID_FORMAT.match(g.uuid) for g in gpus)
        assert len({g.uuid for g in gpus}) == 8
        assert len({g.pci_bus_id for g in gpus}) == 8
        assert {g.name for g in gpus} == {H100.product_name}

    def test_uuids_are_stable_for_a_seed_and_differ_between_seeds(self) -> None:
        first = [g.uuid for g in virtual_backend(seed=7)[0].inventory()]
        again = [g.uuid for g in virtual_backend(seed=7)[0].inventory()]
        other = [g.uuid for g in virtual_backend(seed=8)[0].inventory()]
        assert first == again
        assert set(first).isdisjoint(other)

    def test_supported_clocks_are_the_profile_grid_and_its_one_memory_clock(self) -> None:
        backend, _ = virtual_backend(builtin_profile("gb200"))
        assert list(backend.supported_sm_clocks_mhz(0)) == list(builtin_profile("gb200").sm_clock_grid_mhz())
        assert list(backend.supported_mem_clocks_mhz(0)) == [3996]
        assert backend.power_limit_w(0) == 1200

    def test_a_closed_backend_refuses_calls_and_closing_twice_is_fine(self) -> None:
        backend, _ = virtual_backend()
        backend.close()
        backend.close()
        with pytest.raises(BackendFailure):
            backend.clocks(0)


class TestClocks:
    def test_a_compute_heavy_segment_under_the_default_governor_holds_the_power_limited_clock(self) -> None:
        backend, clock = virtual_backend()
        heavy(backend)
        clock.advance(0.2)
        expected = power_limited_clock_mhz(QUIET_H100, HEAVY_COMPUTE_MHZ_S, HEAVY_MEMORY_S)
        assert 1650 <= expected <= 1700
        assert backend.clocks(0).sm_clock_mhz == expected
        assert backend.clock_event_reasons(0) == ClockEventReasons.SW_POWER_CAP
        assert backend.power_w(0) == pytest.approx(700, abs=5)

    def test_a_memory_bound_segment_under_the_default_governor_runs_at_the_top_clock(self) -> None:
        backend, clock = virtual_backend()
        backend.device.submit_segments(0, [LIGHT_COMPUTE_MHZ_S] * 50, [LIGHT_MEMORY_S] * 50)
        clock.advance(0.2)
        assert backend.clocks(0).sm_clock_mhz == 1980
        assert backend.clock_event_reasons(0) == ClockEventReasons.NONE
        assert backend.power_w(0) < 420

    def test_a_lock_below_the_power_limited_clock_holds_exactly(self) -> None:
        backend, clock = virtual_backend()
        assert backend.lock_sm_clock(0, 1200) == 1200
        clock.advance(0.1)
        heavy(backend)
        clock.advance(0.2)
        assert backend.clocks(0).sm_clock_mhz == 1200
        assert backend.clock_event_reasons(0) == ClockEventReasons.APPLICATIONS_CLOCKS_SETTING
        assert backend.power_w(0) < 600

    def test_a_lock_above_the_power_limited_clock_is_still_capped_and_says_so(self) -> None:
        backend, clock = virtual_backend()
        heavy(backend, count=3)
        clock.advance(0.1)
        expected = power_limited_clock_mhz(QUIET_H100, HEAVY_COMPUTE_MHZ_S, HEAVY_MEMORY_S)
        assert backend.lock_sm_clock(0, 1980) == expected
        clock.advance(1.0)
        assert backend.clocks(0).sm_clock_mhz == expected
        assert backend.clock_event_reasons(0) == ClockEventReasons.SW_POWER_CAP

    def test_an_idle_gpu_reports_its_lock_or_else_the_lowest_clock_and_the_idle_reason(self) -> None:
        backend, clock = virtual_backend()
        assert backend.clocks(0).sm_clock_mhz == 345
        assert backend.clock_event_reasons(0) == ClockEventReasons.GPU_IDLE
        backend.lock_sm_clock(0, 1500)
        clock.advance(0.1)
        assert backend.clocks(0).sm_clock_mhz == 1500
        assert backend.clocks(0).mem_clock_mhz == 2619

    def test_a_lock_takes_clock_switch_ms_to_hold_and_work_in_that_window_runs_at_the_old_clock(self) -> None:
        backend, clock = virtual_backend()
        backend.device.submit_segments(0, [1.0] * 400, [0.0] * 400)  # 0.5-0.8 ms each
        clock.advance(0.05)
        backend.lock_sm_clock(0, 1200)
        clock.advance(0.010)  # 10 ms of the 15 ms switch
        assert backend.clocks(0).sm_clock_mhz > 1200
        clock.advance(0.010)
        assert backend.clocks(0).sm_clock_mhz == 1200

    def test_a_lock_applied_mid_phase_slows_the_rest_of_the_phase(self) -> None:
        backend, clock = virtual_backend()
        count = 20
        forecast = backend.device.run_segments(0, [HEAVY_COMPUTE_MHZ_S] * count, [0.0] * count, sleep=False)
        ticket = backend.device.submit_segments(1, [HEAVY_COMPUTE_MHZ_S] * count, [0.0] * count)
        clock.advance(forecast.duration_s / 2)
        backend.lock_sm_clock(1, 900)
        result = backend.device.wait(ticket)
        assert not forecast.final
        assert result.final
        assert result.duration_s > forecast.duration_s * 1.2
        assert result.energy_j < forecast.energy_j

    def test_resetting_the_lock_returns_to_the_default_governor(self) -> None:
        backend, clock = virtual_backend()
        backend.lock_sm_clock(0, 900)
        clock.advance(0.1)
        backend.reset_sm_clock(0)
        clock.advance(0.1)
        heavy(backend)
        clock.advance(0.1)
        assert backend.clocks(0).sm_clock_mhz == power_limited_clock_mhz(
            QUIET_H100, HEAVY_COMPUTE_MHZ_S, HEAVY_MEMORY_S
        )

    def test_without_lock_support_locks_are_refused_and_application_clocks_cap_the_clock(self) -> None:
        backend, clock = virtual_backend(replace(QUIET_H100, locked_clocks=False))
        assert backend.supports_locked_clocks(0) is False
        with pytest.raises(NotSupported):
            backend.lock_sm_clock(0, 1200)
        backend.reset_sm_clock(0)  # nothing to reset: not an error
        backend.set_application_clocks(0, 2619, 1200)
        clock.advance(0.1)
        heavy(backend, count=3)
        clock.advance(0.1)
        assert backend.clocks(0).sm_clock_mhz == 1200
        backend.reset_application_clocks(0)
        clock.advance(1.0)
        assert backend.clocks(0).sm_clock_mhz > 1600

    def test_a_memory_clock_lock_accepts_only_the_profiles_memory_clock(self) -> None:
        backend, _ = virtual_backend()
        backend.lock_mem_clock(0, 2619)
        backend.reset_mem_clock(0)
        with pytest.raises(InvalidArgument):
            backend.lock_mem_clock(0, 1593)


class TestWork:
    def test_a_segment_takes_the_spec_duration_and_energy_and_the_virtual_clock_moves_by_it(self) -> None:
        backend, clock = virtual_backend()
        backend.lock_sm_clock(0, 1200)
        clock.advance(0.1)
        start = clock.now_s()
        result = backend.device.run_segments(0, [HEAVY_COMPUTE_MHZ_S], [HEAVY_MEMORY_S])
        duration = physics.segment_duration_s(HEAVY_COMPUTE_MHZ_S, HEAVY_MEMORY_S, 1200.0)
        assert result.duration_s == pytest.approx(duration, rel=1e-12)
        assert result.energy_j == pytest.approx(
            segment_energy_j(QUIET_H100, HEAVY_COMPUTE_MHZ_S, HEAVY_MEMORY_S, 1200.0), rel=1e-12
        )
        assert result.start_s == start
        assert clock.now_s() >= result.end_s

    def test_noise_factors_multiply_duration_and_power(self) -> None:
        backend, _ = virtual_backend()
        plain = backend.device.run_segments(0, [LIGHT_COMPUTE_MHZ_S], [LIGHT_MEMORY_S])
        noisy = backend.device.run_segments(0, [LIGHT_COMPUTE_MHZ_S], [LIGHT_MEMORY_S], 1.0, [1.1], [0.9])
        assert noisy.duration_s == pytest.approx(plain.duration_s * 1.1, rel=1e-12)
        assert noisy.average_power_w == pytest.approx(plain.average_power_w * 0.9, rel=1e-12)

    def test_communication_segments_draw_less_memory_power(self) -> None:
        backend, _ = virtual_backend()
        full = backend.device.run_segments(0, [0.0], [1.0])
        comm = backend.device.run_segments(0, [0.0], [1.0], 0.3)
        assert comm.duration_s == pytest.approx(full.duration_s)
        assert full.average_power_w - comm.average_power_w == pytest.approx(0.7 * QUIET_H100.mem_power_w)

    def test_a_phase_of_thousands_of_segments_costs_exactly_its_segments(self) -> None:
        backend, _ = virtual_backend()
        rng = np.random.default_rng(3)
        count = 3000
        compute = rng.uniform(0.5, 4, count)  # memory-bound: never reaches the power limit
        memory = rng.uniform(0.004, 0.01, count)
        before = backend.true_energy_j(0)
        result = backend.device.run_segments(0, compute, memory)
        clocks = np.full(count, 1980.0)
        expected_s = float(np.sum(physics.segment_duration_s(compute, memory, clocks)))
        expected_j = float(
            np.sum(
                physics.segment_duration_s(compute, memory, clocks)
                * physics.segment_power_w(QUIET_H100, compute, memory, clocks)
            )
        )
        assert result.duration_s == pytest.approx(expected_s, rel=1e-9)
        assert result.energy_j == pytest.approx(expected_j, rel=1e-9)
        assert backend.true_energy_j(0) - before == pytest.approx(expected_j, rel=1e-9)

    def test_between_segments_a_gpu_draws_idle_power(self) -> None:
        backend, clock = virtual_backend()
        backend.device.run_segments(0, [HEAVY_COMPUTE_MHZ_S], [HEAVY_MEMORY_S])
        before = backend.true_energy_j(0)
        clock.advance(2.0)
        assert backend.true_energy_j(0) - before == pytest.approx(2.0 * QUIET_H100.idle_power_w)
        assert backend.power_w(0) == pytest.approx(QUIET_H100.idle_power_w)
        assert backend.utilization(0).gpu_percent == 0

    def test_work_queued_behind_other_work_starts_when_that_ends(self) -> None:
        backend, _ = virtual_backend()
        first = backend.device.submit_segments(0, [HEAVY_COMPUTE_MHZ_S], [0.0])
        second = backend.device.run_segments(0, [HEAVY_COMPUTE_MHZ_S], [0.0])
        done = backend.device.poll(first)
        assert done is not None
        assert second.start_s == pytest.approx(done.end_s)

    def test_draws_of_noise_are_log_normal_around_one_and_reproducible_for_a_seed(self) -> None:
        one = virtual_backend(H100, seed=5)[0].device.draw_noise(0, 4000)
        two = virtual_backend(H100, seed=5)[0].device.draw_noise(0, 4000)
        np.testing.assert_array_equal(one[0], two[0])
        assert float(np.std(np.log(one[0]))) == pytest.approx(H100.noise_duration, rel=0.1)
        assert float(np.median(one[1])) == pytest.approx(1.0, abs=0.005)

    def test_malformed_segments_are_rejected_before_anything_runs(self) -> None:
        backend, _ = virtual_backend()
        with pytest.raises(InvalidArgument):
            backend.device.run_segments(0, [1.0, 2.0], [0.1])
        with pytest.raises(InvalidArgument):
            backend.device.run_segments(0, [-1.0], [0.1])
        with pytest.raises(InvalidArgument):
            backend.device.run_segments(0, [1.0], [0.1], 1.0, [0.0])
        assert backend.utilization(0).gpu_percent == 0


class TestMeasurement:
    def test_the_energy_counter_moves_only_at_counter_steps_and_never_backwards(self) -> None:
        backend, clock = virtual_backend()
        heavy(backend, count=2)
        clock.advance_to(0.205)
        at_step = backend.total_energy_mj(0)
        clock.advance_to(0.295)
        assert backend.total_energy_mj(0) == at_step
        clock.advance_to(0.305)
        assert backend.total_energy_mj(0) > at_step
        readings = []
        for _ in range(40):
            clock.advance(0.037)
            readings.append(backend.total_energy_mj(0))
        assert readings == sorted(readings)

    def test_counter_differences_between_steps_equal_the_true_energy_to_the_millijoule(self) -> None:
        backend, clock = virtual_backend(H100)
        noise = backend.device.draw_noise(0, 30)
        backend.device.submit_segments(0, [HEAVY_COMPUTE_MHZ_S / 10] * 30, [0.02] * 30, 1.0, *noise)
        clock.advance_to(0.1)
        counter_start, true_start = backend.total_energy_mj(0), backend.true_energy_j(0)
        clock.advance_to(2.5)
        counter_end, true_end = backend.total_energy_mj(0), backend.true_energy_j(0)
        assert abs((counter_end - counter_start) - 1000 * (true_end - true_start)) <= 1

    def test_power_is_the_average_of_the_last_100_ms(self) -> None:
        backend, clock = virtual_backend()
        result = backend.device.run_segments(0, [HEAVY_COMPUTE_MHZ_S], [0.0])
        clock.advance_to(result.end_s + 0.05)
        assert backend.power_w(0) == pytest.approx((result.average_power_w + QUIET_H100.idle_power_w) / 2)

    def test_utilization_reports_the_busy_share_of_the_last_100_ms(self) -> None:
        backend, clock = virtual_backend()
        result = backend.device.run_segments(0, [0.0], [1.0])
        assert backend.utilization(0).gpu_percent == 100
        assert backend.utilization(0).memory_percent == 100
        clock.advance_to(result.end_s + 0.075)
        assert backend.utilization(0).gpu_percent == 25

    def test_reading_often_or_rarely_gives_the_same_energy(self) -> None:
        def run(reads: int) -> float:
            backend, clock = virtual_backend(H100)
            noise = backend.device.draw_noise(0, 200)
            backend.device.submit_segments(0, np.linspace(1, 900, 200), np.full(200, 0.005), 1.0, *noise)
            backend.lock_sm_clock(0, 1410)
            for _ in range(reads):
                clock.advance(30.0 / reads)
                backend.power_w(0)
            return backend.true_energy_j(0)

        assert run(1) == pytest.approx(run(997), rel=1e-12)

    @pytest.mark.parametrize("busy", [False, True])
    def test_reading_often_or_rarely_gives_the_same_power_and_utilisation(self, busy: bool) -> None:
        """Frequent reads take the one-interval path of the model; one late read takes the general one."""

        def run(reads: int) -> tuple[float, float, float, int]:
            backend, clock = virtual_backend(H100)
            if busy:
                backend.device.submit_segments(
                    0, np.full(4, 400.0), np.full(4, 0.2), 1.0, *backend.device.draw_noise(0, 4)
                )
            backend.lock_sm_clock(0, 1410)
            for _ in range(reads):
                clock.advance(1.0 / reads)
                backend.total_energy_mj(0)
            utilisation = backend.utilization(0)
            return (
                backend.power_w(0),
                utilisation.gpu_percent,
                utilisation.memory_percent,
                backend.total_energy_mj(0),
            )

        rarely, often = run(1), run(499)
        assert often == pytest.approx(rarely, rel=1e-9)

    @staticmethod
    def many_rows_then_idle() -> tuple[SimBackend, VirtualClock]:
        """40 short segments at alternating clocks inside the power window, then idle reads: closed
        rows, and a tail that only moves."""
        backend, clock = virtual_backend(H100)
        backend.device.submit_segments(
            0, np.full(40, 1.0), np.full(40, 0.001), 1.0, *backend.device.draw_noise(0, 40)
        )
        for step in range(40):
            backend.lock_sm_clock(0, 1410 if step % 2 else 1200)
            clock.advance(0.0015)
            backend.total_energy_mj(0)
        for _ in range(5):
            clock.advance(0.001)
            backend.total_energy_mj(0)
        return backend, clock

    def test_the_history_tail_counts_in_both_ways_of_summing_the_power_window(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Up to SMALL_HISTORY_ROWS rows the window is summed in plain floats, above in numpy."""
        backend, _clock = self.many_rows_then_idle()
        gpu = backend.device.observe(0)
        assert gpu.history_tail is not None
        assert gpu.history.shape[0] >= 8
        figures = []
        for small in (0, 10_000):
            monkeypatch.setattr(sim_model, "SMALL_HISTORY_ROWS", small)
            figures.append((backend.power_w(0), backend.utilization(0).gpu_percent))
        assert figures[0] == pytest.approx(figures[1], rel=1e-12)
        rows = gpu.full_history()
        weights = np.clip(
            np.minimum(rows[:, 1], gpu.time_s) - np.maximum(rows[:, 0], gpu.time_s - 0.1), 0, None
        )
        assert figures[0][0] == pytest.approx(
            float(np.sum(rows[:, 2] * weights) / np.sum(weights)), rel=1e-12
        )

    def test_a_state_file_keeps_the_whole_history_tail_included(self) -> None:
        backend, _clock = self.many_rows_then_idle()
        state = backend.device.store.load()
        assert state is not None
        reread = decode_state(encode_state(state))
        for before, after in zip(state.gpus, reread.gpus, strict=True):
            assert np.array_equal(before.full_history(), after.full_history())
            assert after.history_tail == before.history_tail
        document = json.loads(encode_state(state))  # the format of docs/sim-backend.md: every row listed
        assert document["gpus"][0]["history"]["rows"] == state.gpus[0].full_history().shape[0]

    def test_a_change_leaves_the_stored_state_it_started_from_untouched(self) -> None:
        """Transactions share the arrays of the state they copy; the copy must never write through."""
        backend, clock = virtual_backend(H100)
        backend.device.submit_segments(
            0, np.full(2, 400.0), np.full(2, 0.2), 1.0, *backend.device.draw_noise(0, 2)
        )
        clock.advance(0.05)
        before = backend.device.store.load().gpus[0]
        snapshot = before.clone()
        backend.lock_sm_clock(0, 1410)
        backend.device.inject_fault(0, "power_w", InvalidArgument, once=True)
        clock.advance(0.3)
        backend.total_energy_mj(0)
        after = backend.device.store.load().gpus[0]
        assert after is not before
        assert after.sm_lock_mhz == 1410
        assert "power_w" in after.faults
        assert before.sm_lock_mhz is None
        assert before.faults == {}
        assert before.time_s == snapshot.time_s
        assert np.array_equal(before.full_history(), snapshot.full_history())
        assert np.array_equal(before.queue, snapshot.queue)
        assert before.energy_j == snapshot.energy_j
        assert before.marks == snapshot.marks


class TestValidation:
    @pytest.mark.parametrize("method", sorted(INDEXED_CALLS))
    @pytest.mark.parametrize("index", [-1, 2, True])
    def test_an_unknown_gpu_index_is_an_invalid_argument(self, method: str, index: int) -> None:
        backend, _ = virtual_backend(gpus=2)
        with pytest.raises(InvalidArgument):
            INDEXED_CALLS[method](backend, index)

    @pytest.mark.parametrize("sm_clock_mhz", [1201, 300, 2000, 0])
    def test_a_clock_off_the_grid_is_rejected_and_changes_nothing(self, sm_clock_mhz: int) -> None:
        backend, clock = virtual_backend()
        with pytest.raises(InvalidArgument):
            backend.lock_sm_clock(0, sm_clock_mhz)
        with pytest.raises(InvalidArgument):
            backend.set_application_clocks(0, 2619, sm_clock_mhz)
        clock.advance(0.1)
        assert backend.clocks(0).sm_clock_mhz == 345

    def test_application_clocks_need_the_supported_memory_clock(self) -> None:
        backend, _ = virtual_backend()
        with pytest.raises(InvalidArgument):
            backend.set_application_clocks(0, 1600, 1200)


class TestFaults:
    @pytest.mark.parametrize("method", sorted(INDEXED_CALLS))
    def test_a_once_fault_fires_on_the_next_call_only(self, method: str) -> None:
        backend, _ = virtual_backend()
        backend.inject_fault(1, method, NoPermission, once=True)
        INDEXED_CALLS[method](backend, 0)
        with pytest.raises(NoPermission) as raised:
            INDEXED_CALLS[method](backend, 1)
        assert raised.value.gpu_index == 1
        INDEXED_CALLS[method](backend, 1)

    @pytest.mark.parametrize("error", [NoPermission, NotSupported, GpuLost, InvalidArgument, BackendFailure])
    def test_a_standing_fault_fires_until_cleared(self, error: type[GpuError]) -> None:
        backend, _ = virtual_backend()
        backend.inject_fault(0, "total_energy_mj", error, once=False)
        for _ in range(3):
            with pytest.raises(error):
                backend.total_energy_mj(0)
        backend.clear_faults()
        backend.total_energy_mj(0)

    def test_a_fault_on_the_inventory_fires_when_it_is_listed(self) -> None:
        backend, _ = virtual_backend()
        backend.inject_fault(1, "inventory", BackendFailure, once=True)
        with pytest.raises(BackendFailure):
            backend.inventory()
        assert len(backend.inventory()) == 2

    def test_a_faulted_lock_changes_nothing(self) -> None:
        backend, clock = virtual_backend()
        backend.inject_fault(0, "lock_sm_clock", NoPermission, once=True)
        with pytest.raises(NoPermission):
            backend.lock_sm_clock(0, 900)
        clock.advance(0.1)
        assert backend.clocks(0).sm_clock_mhz == 345

    def test_a_lost_gpu_raises_gpu_lost_everywhere_but_stays_in_the_inventory(self) -> None:
        backend, _ = virtual_backend()
        ticket = backend.device.submit_segments(0, [HEAVY_COMPUTE_MHZ_S], [0.0])
        backend.lose_gpu(0)
        for call in INDEXED_CALLS.values():
            with pytest.raises(GpuLost):
                call(backend, 0)
            call(backend, 1)
        with pytest.raises(GpuLost):
            backend.device.wait(ticket)
        assert len(backend.inventory()) == 2
        backend.recover_gpu(0)
        assert backend.utilization(0).gpu_percent == 0

    def test_a_driver_reload_restarts_the_counter_from_zero(self) -> None:
        backend, clock = virtual_backend()
        clock.advance(1.0)
        before = backend.total_energy_mj(0)
        backend.reset_energy_counter(0)
        assert backend.total_energy_mj(0) < before
        assert backend.total_energy_mj(0) == 0
        clock.advance(1.0)
        after = backend.total_energy_mj(0)
        assert 0 < after <= 1000 * 1.0 * QUIET_H100.idle_power_w + 1
        assert backend.total_energy_mj(1) > before

    def test_only_backend_methods_and_gpu_errors_can_be_injected(self) -> None:
        backend, _ = virtual_backend()
        with pytest.raises(InvalidArgument):
            backend.inject_fault(0, "name", NoPermission, once=True)
        with pytest.raises(InvalidArgument):
            backend.inject_fault(0, "clocks", ValueError, once=True)  # type: ignore[arg-type]


class TestClocksThemselves:
    def test_a_virtual_clock_moves_only_forward_and_only_when_told(self) -> None:
        clock = VirtualClock(5.0)
        assert clock.now_s() == 5.0
        clock.sleep_s(1.5)
        assert clock.advance_to(2.0) == 6.5
        with pytest.raises(ValueError, match="backwards"):
            clock.advance(-1)

    def test_a_device_with_the_same_seed_and_inputs_is_deterministic(self) -> None:
        def energy() -> tuple[float, int]:
            backend = create_sim_backend(H100, 1, clock=VirtualClock(), seed=11)
            noise = backend.device.draw_noise(0, 100)
            backend.device.run_segments(0, np.linspace(1, 500, 100), np.full(100, 0.004), 1.0, *noise)
            return backend.true_energy_j(0), backend.total_energy_mj(0)

        assert energy() == energy()
