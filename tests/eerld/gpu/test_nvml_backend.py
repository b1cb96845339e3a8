"""The NVML backend, method by method, against the fake pynvml module (no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pynvml
import pytest
from structlog.testing import capture_logs

from eerld.errors import BackendFailure, GpuError, InvalidArgument, NoPermission, NotSupported
from eerld.gpu.base import ClockEventReasons, GpuBackend, GpuClocks, GpuIdentity, GpuUtilization
from eerld.gpu.counters import EnergyCounter
from eerld.gpu.nvml import REASON_BY_NVML_BIT, NvmlBackend
from tests.eerld.gpu.fake_pynvml import H100_SM_CLOCKS_MHZ, FakeGpu, FakePynvml, LegacyFakePynvml, make_gpus


@pytest.fixture
def fake() -> FakePynvml:
    return FakePynvml(make_gpus(2))


@pytest.fixture
def backend(fake: FakePynvml) -> Iterator[NvmlBackend]:
    with NvmlBackend(fake) as b:
        yield b


class TestLifecycle:
    def test_creating_the_backend_initialises_nvml(self, fake: FakePynvml) -> None:
        NvmlBackend(fake)
        assert fake.init_count == 1

    def test_close_shuts_nvml_down(self, fake: FakePynvml) -> None:
        NvmlBackend(fake).close()
        assert fake.init_count == 0

    def test_close_twice_shuts_down_once(self, fake: FakePynvml) -> None:
        backend = NvmlBackend(fake)
        backend.close()
        backend.close()
        assert [name for name, _ in fake.calls].count("nvmlShutdown") == 1

    def test_leaving_the_context_closes_the_backend(self, fake: FakePynvml) -> None:
        with NvmlBackend(fake):
            pass
        assert fake.init_count == 0

    def test_a_closed_backend_refuses_calls(self, fake: FakePynvml) -> None:
        backend = NvmlBackend(fake)
        backend.close()
        with pytest.raises(BackendFailure, match="closed"):
            backend.power_w(0)

    def test_a_missing_nvml_library_is_a_backend_failure_at_creation(self) -> None:
        with pytest.raises(BackendFailure, match=r"nvmlInit.*NVML_ERROR_LIBRARY_NOT_FOUND") as info:
            NvmlBackend(FakePynvml(library_present=False))
        assert info.value.gpu_index is None

    def test_an_unloaded_driver_is_a_backend_failure_at_creation(self) -> None:
        with pytest.raises(BackendFailure, match="NVML_ERROR_DRIVER_NOT_LOADED"):
            NvmlBackend(FakePynvml(driver_loaded=False))

    def test_by_default_the_installed_pynvml_module_is_used(
        self, fake: FakePynvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        NvmlBackend()
        assert fake.init_count == 1

    def test_without_nvidia_ml_py_creation_is_a_backend_failure(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setitem(sys.modules, "pynvml", None)
        with pytest.raises(BackendFailure, match="nvidia-ml-py"):
            NvmlBackend()

    def test_a_forked_child_is_refused_rather_than_given_the_parents_handles(
        self, fake: FakePynvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        backend = NvmlBackend(fake)
        parent_pid = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: parent_pid + 1)
        with pytest.raises(BackendFailure, match="forked child"):
            backend.clocks(0)

    def test_a_forked_child_closing_leaves_the_parents_nvml_alone(
        self, fake: FakePynvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        backend = NvmlBackend(fake)
        parent_pid = os.getpid()
        monkeypatch.setattr(os, "getpid", lambda: parent_pid + 1)
        backend.close()
        assert fake.init_count == 1

    def test_no_method_forks_or_spawns_a_process(
        self, fake: FakePynvml, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def refuse(*args: Any, **kwargs: Any) -> Any:
            raise AssertionError("the NVML backend must never fork or spawn")

        monkeypatch.setattr(os, "fork", refuse)
        monkeypatch.setattr(os, "posix_spawn", refuse)
        monkeypatch.setattr(subprocess, "Popen", refuse)
        backend = NvmlBackend(fake)
        backend.inventory()
        backend.lock_sm_clock(0, 1500)
        backend.supports_locked_clocks(0)
        backend.reset_sm_clock(0)
        backend.set_application_clocks(0, 2619, 1500)
        backend.reset_application_clocks(0)
        backend.lock_mem_clock(0, 1593)
        backend.reset_mem_clock(0)
        backend.clocks(0)
        backend.total_energy_mj(0)
        backend.power_w(0)
        backend.power_limit_w(0)
        backend.utilization(0)
        backend.clock_event_reasons(0)
        backend.close()

    def test_it_implements_the_backend_protocol_and_is_named_nvml(self, backend: NvmlBackend) -> None:
        assert isinstance(backend, GpuBackend)
        assert backend.name == "nvml"


class TestInventory:
    def test_lists_every_gpu_by_index_with_uuid_name_and_pci_bus_id(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        assert list(backend.inventory()) == [
            GpuIdentity(index=i, uuid=g.uuid, name=g.name, pci_bus_id=g.pci_bus_id)
            for i, g in enumerate(fake.gpus)
        ]

    def test_byte_strings_of_older_nvidia_ml_py_read_the_same(self) -> None:
        gpus = make_gpus(2)
        expected = NvmlBackend(FakePynvml(gpus)).inventory()
        assert NvmlBackend(LegacyFakePynvml(gpus)).inventory() == expected

    def test_a_node_without_gpus_has_an_empty_inventory(self) -> None:
        assert list(NvmlBackend(FakePynvml([])).inventory()) == []


class TestSupportedClocks:
    def test_sm_clocks_are_those_of_the_highest_memory_clock_ascending_without_duplicates(self) -> None:
        gpu = FakeGpu(
            uuid="GPU-a",
            mem_clocks_mhz=(1593, 2619, 1593),
            sm_clocks_by_mem_mhz={2619: (1980, 1965, 1965, 1950), 1593: (1410, 1395)},
        )
        backend = NvmlBackend(FakePynvml([gpu]))
        assert list(backend.supported_sm_clocks_mhz(0)) == [1950, 1965, 1980]

    def test_memory_clocks_are_ascending_without_duplicates(self) -> None:
        gpu = FakeGpu(uuid="GPU-a", mem_clocks_mhz=(2619, 1593, 2619))
        assert list(NvmlBackend(FakePynvml([gpu])).supported_mem_clocks_mhz(0)) == [1593, 2619]

    def test_an_h100_lists_its_full_sm_clock_ladder(self, backend: NvmlBackend) -> None:
        assert list(backend.supported_sm_clocks_mhz(1)) == sorted(H100_SM_CLOCKS_MHZ)

    def test_a_gpu_without_memory_clocks_has_no_sm_clocks(self) -> None:
        gpu = FakeGpu(uuid="GPU-a", mem_clocks_mhz=(), sm_clocks_by_mem_mhz={})
        assert list(NvmlBackend(FakePynvml([gpu])).supported_sm_clocks_mhz(0)) == []


class TestClocks:
    def test_reports_the_sm_and_memory_clocks_that_hold(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        fake.gpus[1].default_sm_clock_mhz = 1755
        fake.gpus[1].default_mem_clock_mhz = 1593
        assert backend.clocks(1) == GpuClocks(sm_clock_mhz=1755, mem_clock_mhz=1593)


class TestLockSmClock:
    def test_locks_min_and_max_to_the_clock_and_returns_the_clock_read_back(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        assert backend.lock_sm_clock(0, 1410) == 1410
        assert fake.gpus[0].sm_lock_range_mhz == (1410, 1410)
        assert backend.clocks(0).sm_clock_mhz == 1410

    def test_locks_only_the_gpu_named(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        backend.lock_sm_clock(1, 1410)
        assert fake.gpus[0].sm_lock_range_mhz is None

    def test_returns_the_lower_clock_the_hardware_holds_under_the_power_limit(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].power_capped_sm_clock_mhz = 1650
        assert backend.lock_sm_clock(0, 1980) == 1650

    def test_logs_a_warning_with_the_reasons_when_the_hardware_holds_less(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].power_capped_sm_clock_mhz = 1650
        with capture_logs() as logs:
            backend.lock_sm_clock(0, 1980)
        assert logs == [
            {
                "event": "sm_clock_below_lock",
                "log_level": "warning",
                "gpu_index": 0,
                "requested_sm_clock_mhz": 1980,
                "held_sm_clock_mhz": 1650,
                "clock_event_reasons": ["sw_power_cap"],
            }
        ]

    def test_still_reports_a_short_lock_when_the_reasons_cannot_be_read(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].power_capped_sm_clock_mhz = 1650
        fake.inject_error("nvmlDeviceGetCurrentClocksEventReasons", pynvml.NVML_ERROR_NOT_SUPPORTED)
        with capture_logs() as logs:
            assert backend.lock_sm_clock(0, 1980) == 1650
        assert logs[0]["clock_event_reasons"] == ["unknown"]

    def test_logs_nothing_when_the_hardware_holds_the_lock(self, backend: NvmlBackend) -> None:
        with capture_logs() as logs:
            backend.lock_sm_clock(0, 1410)
        assert logs == []

    def test_an_unsupported_clock_is_rejected_naming_the_nearest_supported_ones(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        with pytest.raises(
            InvalidArgument, match=r"1412 MHz .* nearest supported: 1410 and 1425 MHz"
        ) as info:
            backend.lock_sm_clock(0, 1412)
        assert info.value.gpu_index == 0
        assert fake.mutating_calls() == []

    def test_a_clock_above_the_ladder_is_rejected_naming_the_highest(self, backend: NvmlBackend) -> None:
        with pytest.raises(InvalidArgument, match=r"nearest supported: 1980 MHz \(range 345–1980 MHz\)"):
            backend.lock_sm_clock(0, 2100)

    def test_without_root_the_lock_is_refused(self) -> None:
        backend = NvmlBackend(FakePynvml(privileged=False))
        with pytest.raises(NoPermission, match="nvmlDeviceSetGpuLockedClocks failed on GPU 0"):
            backend.lock_sm_clock(0, 1410)

    def test_reset_returns_the_gpu_to_the_default_governor(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        backend.lock_sm_clock(0, 1410)
        backend.reset_sm_clock(0)
        assert fake.gpus[0].sm_lock_range_mhz is None
        assert backend.clocks(0).sm_clock_mhz == fake.gpus[0].default_sm_clock_mhz


class TestSupportsLockedClocks:
    def test_a_hopper_gpu_supports_locks_and_finding_out_changes_nothing(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        assert backend.supports_locked_clocks(0) is True
        assert fake.mutating_calls() == []

    def test_a_gpu_older_than_volta_does_not(self) -> None:
        gpu = FakeGpu(uuid="GPU-p100", architecture=pynvml.NVML_DEVICE_ARCH_PASCAL)
        assert NvmlBackend(FakePynvml([gpu])).supports_locked_clocks(0) is False

    def test_an_unknown_architecture_is_given_the_benefit_of_the_doubt(self, fake: FakePynvml) -> None:
        fake.inject_error("nvmlDeviceGetArchitecture", pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        assert NvmlBackend(fake).supports_locked_clocks(0) is True

    def test_a_gpu_whose_lock_answered_not_supported_is_remembered_as_such(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].supports_sm_locks = False
        with pytest.raises(NotSupported):
            backend.lock_sm_clock(0, 1410)
        assert backend.supports_locked_clocks(0) is False
        assert backend.supports_locked_clocks(1) is True

    def test_a_lock_refused_for_lack_of_privilege_does_not_count_as_unsupported(self) -> None:
        backend = NvmlBackend(FakePynvml(privileged=False))
        with pytest.raises(NoPermission):
            backend.lock_sm_clock(0, 1410)
        assert backend.supports_locked_clocks(0) is True

    def test_locks_turned_off_for_the_node_are_unsupported_and_never_attempted(
        self, fake: FakePynvml
    ) -> None:
        backend = NvmlBackend(fake, use_locked_clocks=False)
        assert backend.supports_locked_clocks(0) is False
        with pytest.raises(NotSupported, match="application clocks"):
            backend.lock_sm_clock(0, 1410)
        assert fake.mutating_calls() == []


class TestMemoryClockLock:
    def test_lock_and_reset_change_the_memory_clock_that_holds(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        backend.lock_mem_clock(0, 1593)
        assert fake.gpus[0].mem_lock_range_mhz == (1593, 1593)
        assert backend.clocks(0).mem_clock_mhz == 1593
        backend.reset_mem_clock(0)
        assert backend.clocks(0).mem_clock_mhz == 2619

    def test_an_unsupported_memory_clock_is_rejected_naming_the_nearest(self, backend: NvmlBackend) -> None:
        with pytest.raises(
            InvalidArgument, match=r"2000 MHz is not a supported memory clock.*1593 and 2619 MHz"
        ):
            backend.lock_mem_clock(0, 2000)

    def test_a_gpu_that_cannot_lock_memory_says_not_supported(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].supports_mem_locks = False
        with pytest.raises(NotSupported, match="nvmlDeviceSetMemoryLockedClocks"):
            backend.lock_mem_clock(0, 1593)


class TestApplicationClocks:
    def test_set_and_reset_change_the_clocks_that_hold(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        backend.set_application_clocks(1, mem_clock_mhz=2619, sm_clock_mhz=1500)
        assert backend.clocks(1) == GpuClocks(sm_clock_mhz=1500, mem_clock_mhz=2619)
        backend.reset_application_clocks(1)
        assert fake.gpus[1].app_clocks_mhz is None

    def test_an_sm_clock_not_offered_at_that_memory_clock_is_rejected(self) -> None:
        gpu = FakeGpu(uuid="GPU-a", sm_clocks_by_mem_mhz={2619: (1980, 1500), 1593: (1200, 1100)})
        backend = NvmlBackend(FakePynvml([gpu]))
        with pytest.raises(
            InvalidArgument, match=r"SM clock at memory clock 1593 MHz; nearest supported: 1200"
        ):
            backend.set_application_clocks(0, mem_clock_mhz=1593, sm_clock_mhz=1500)

    def test_an_unsupported_memory_clock_is_rejected(self, backend: NvmlBackend) -> None:
        with pytest.raises(InvalidArgument, match="memory clock"):
            backend.set_application_clocks(0, mem_clock_mhz=3000, sm_clock_mhz=1500)

    def test_a_gpu_without_application_clocks_says_not_supported(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].supports_app_clocks = False
        with pytest.raises(NotSupported):
            backend.set_application_clocks(0, mem_clock_mhz=2619, sm_clock_mhz=1500)


class TestEnergy:
    def test_the_counter_is_read_in_millijoules(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        start_mj = backend.total_energy_mj(0)
        fake.run(0, duration_s=2.0)  # 350 W for 2 s
        assert backend.total_energy_mj(0) - start_mj == 700_000

    def test_after_a_driver_reload_the_raw_counter_goes_back_but_no_energy_is_negative(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.run(0, duration_s=10.0)
        meter = EnergyCounter(backend.total_energy_mj(0))
        fake.run(0, duration_s=1.0)
        fake.reload_driver()
        fake.run(0, duration_s=1.0)
        reading_mj = backend.total_energy_mj(0)
        assert reading_mj == 350_000
        delta = meter.observe(reading_mj)
        assert delta.reset_detected
        assert delta.delta_mj == 350_000

    def test_a_gpu_without_an_energy_counter_says_not_supported(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].supports_energy = False
        with pytest.raises(NotSupported, match="nvmlDeviceGetTotalEnergyConsumption"):
            backend.total_energy_mj(0)


class TestPower:
    def test_power_is_converted_from_milliwatts_to_watts(
        self, fake: FakePynvml, backend: NvmlBackend
    ) -> None:
        fake.gpus[0].power_mw = 123_456
        assert backend.power_w(0) == pytest.approx(123.456)

    def test_the_enforced_power_limit_is_in_watts(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        fake.gpus[1].power_limit_mw = 700_000
        assert backend.power_limit_w(1) == pytest.approx(700.0)


class TestUtilization:
    def test_reports_gpu_and_memory_utilisation_percent(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        fake.gpus[0].gpu_util_percent = 97
        fake.gpus[0].mem_util_percent = 41
        assert backend.utilization(0) == GpuUtilization(gpu_percent=97, memory_percent=41)


REASON_CONSTANTS = [
    ("nvmlClocksEventReasonGpuIdle", ClockEventReasons.GPU_IDLE),
    ("nvmlClocksEventReasonApplicationsClocksSetting", ClockEventReasons.APPLICATIONS_CLOCKS_SETTING),
    ("nvmlClocksEventReasonSwPowerCap", ClockEventReasons.SW_POWER_CAP),
    ("nvmlClocksEventReasonHwSlowdown", ClockEventReasons.HW_SLOWDOWN),
    ("nvmlClocksEventReasonSyncBoost", ClockEventReasons.SYNC_BOOST),
    ("nvmlClocksEventReasonSwThermalSlowdown", ClockEventReasons.SW_THERMAL_SLOWDOWN),
    ("nvmlClocksEventReasonHwThermalSlowdown", ClockEventReasons.HW_THERMAL_SLOWDOWN),
    ("nvmlClocksEventReasonHwPowerBrakeSlowdown", ClockEventReasons.HW_POWER_BRAKE_SLOWDOWN),
    ("nvmlClocksEventReasonDisplayClockSetting", ClockEventReasons.DISPLAY_CLOCK_SETTING),
]


class TestClockEventReasons:
    @pytest.mark.parametrize(("constant", "reason"), REASON_CONSTANTS)
    def test_each_nvml_reason_bit_becomes_its_flag(
        self, fake: FakePynvml, backend: NvmlBackend, constant: str, reason: ClockEventReasons
    ) -> None:
        fake.gpus[0].extra_event_reasons = getattr(pynvml, constant)
        assert backend.clock_event_reasons(0) == reason

    def test_the_bit_table_covers_exactly_the_reasons_pynvml_names(self) -> None:
        assert dict(REASON_BY_NVML_BIT) == {getattr(pynvml, c): r for c, r in REASON_CONSTANTS}

    def test_several_bits_become_several_flags(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        fake.gpus[0].extra_event_reasons = pynvml.nvmlClocksEventReasonSwPowerCap | 0x40
        assert backend.clock_event_reasons(0).names() == ["sw_power_cap", "hw_thermal_slowdown"]

    def test_no_bits_is_no_reason(self, backend: NvmlBackend) -> None:
        assert backend.clock_event_reasons(0) == ClockEventReasons.NONE

    def test_bits_eerl_does_not_know_are_ignored(self, fake: FakePynvml, backend: NvmlBackend) -> None:
        fake.gpus[0].extra_event_reasons = 0x400 | pynvml.nvmlClocksEventReasonGpuIdle
        assert backend.clock_event_reasons(0) == ClockEventReasons.GPU_IDLE

    def test_older_nvidia_ml_py_is_read_through_the_throttle_reasons_call(self) -> None:
        fake = LegacyFakePynvml(make_gpus(1))
        fake.gpus[0].extra_event_reasons = pynvml.nvmlClocksThrottleReasonSwThermalSlowdown
        assert NvmlBackend(fake).clock_event_reasons(0) == ClockEventReasons.SW_THERMAL_SLOWDOWN
        assert ("nvmlDeviceGetCurrentClocksThrottleReasons", 0) in fake.calls


PER_GPU_METHODS: list[tuple[str, Callable[[NvmlBackend], object]]] = [
    ("supported_sm_clocks_mhz", lambda b: b.supported_sm_clocks_mhz(1)),
    ("supported_mem_clocks_mhz", lambda b: b.supported_mem_clocks_mhz(1)),
    ("clocks", lambda b: b.clocks(1)),
    ("supports_locked_clocks", lambda b: b.supports_locked_clocks(1)),
    ("lock_sm_clock", lambda b: b.lock_sm_clock(1, 1410)),
    ("reset_sm_clock", lambda b: b.reset_sm_clock(1)),
    ("lock_mem_clock", lambda b: b.lock_mem_clock(1, 1593)),
    ("reset_mem_clock", lambda b: b.reset_mem_clock(1)),
    ("set_application_clocks", lambda b: b.set_application_clocks(1, 2619, 1500)),
    ("reset_application_clocks", lambda b: b.reset_application_clocks(1)),
    ("total_energy_mj", lambda b: b.total_energy_mj(1)),
    ("power_w", lambda b: b.power_w(1)),
    ("power_limit_w", lambda b: b.power_limit_w(1)),
    ("utilization", lambda b: b.utilization(1)),
    ("clock_event_reasons", lambda b: b.clock_event_reasons(1)),
]


class TestIndexErrors:
    @pytest.mark.parametrize(("method", "call"), PER_GPU_METHODS, ids=[m for m, _ in PER_GPU_METHODS])
    def test_a_gpu_index_that_does_not_exist_is_an_invalid_argument(
        self, method: str, call: Callable[[NvmlBackend], object]
    ) -> None:
        backend = NvmlBackend(FakePynvml(make_gpus(1)))
        with pytest.raises(InvalidArgument, match="nvmlDeviceGetHandleByIndex failed on GPU 1") as info:
            call(backend)
        assert info.value.gpu_index == 1
        assert isinstance(info.value, GpuError)
