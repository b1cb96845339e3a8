"""The fake pynvml behaves as NVML documents, so that tests against it mean something."""

from __future__ import annotations

import pynvml
import pytest

from tests.eerld.gpu.fake_pynvml import FakeHandle, FakePynvml, make_gpus


@pytest.fixture
def fake() -> FakePynvml:
    module = FakePynvml(make_gpus(2))
    module.nvmlInit()
    return module


class TestFakePynvml:
    def test_every_call_before_init_is_uninitialized(self) -> None:
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            FakePynvml().nvmlDeviceGetCount()

    def test_init_is_reference_counted(self, fake: FakePynvml) -> None:
        fake.nvmlInit()
        fake.nvmlShutdown()
        assert fake.nvmlDeviceGetCount() == 2
        fake.nvmlShutdown()
        with pytest.raises(pynvml.NVMLError_Uninitialized):
            fake.nvmlDeviceGetCount()

    def test_errors_are_the_real_nvml_error_classes(self) -> None:
        with pytest.raises(pynvml.NVMLError_LibraryNotFound):
            FakePynvml(library_present=False).nvmlInit()

    def test_an_index_beyond_the_count_is_an_invalid_argument(self, fake: FakePynvml) -> None:
        with pytest.raises(pynvml.NVMLError_InvalidArgument):
            fake.nvmlDeviceGetHandleByIndex(2)

    def test_supported_clocks_come_highest_first_as_nvml_lists_them(self, fake: FakePynvml) -> None:
        clocks = fake.nvmlDeviceGetSupportedGraphicsClocks(FakeHandle(0), 2619)
        assert clocks == sorted(clocks, reverse=True)

    def test_graphics_clocks_for_an_unsupported_memory_clock_are_not_found(self, fake: FakePynvml) -> None:
        with pytest.raises(pynvml.NVMLError_NotFound):
            fake.nvmlDeviceGetSupportedGraphicsClocks(FakeHandle(0), 1234)

    def test_a_lock_sets_the_reported_clock_up_to_the_power_cap(self, fake: FakePynvml) -> None:
        fake.gpus[0].power_capped_sm_clock_mhz = 1600
        fake.nvmlDeviceSetGpuLockedClocks(FakeHandle(0), 1500, 1500)
        assert fake.nvmlDeviceGetClockInfo(FakeHandle(0), pynvml.NVML_CLOCK_SM) == 1500
        fake.nvmlDeviceSetGpuLockedClocks(FakeHandle(0), 1800, 1800)
        assert fake.nvmlDeviceGetClockInfo(FakeHandle(0), pynvml.NVML_CLOCK_SM) == 1600
        reasons = fake.nvmlDeviceGetCurrentClocksEventReasons(FakeHandle(0))
        assert reasons & pynvml.nvmlClocksEventReasonSwPowerCap

    def test_a_driver_reload_restarts_the_energy_counter_and_drops_locks(self, fake: FakePynvml) -> None:
        fake.nvmlDeviceSetGpuLockedClocks(FakeHandle(0), 1500, 1500)
        fake.run(0, duration_s=1.0)
        fake.reload_driver()
        assert fake.nvmlDeviceGetTotalEnergyConsumption(FakeHandle(0)) == 0
        assert fake.gpus[0].sm_lock_range_mhz is None

    def test_an_injected_error_for_one_call_fails_once_then_clears(self, fake: FakePynvml) -> None:
        fake.inject_error("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT, index=0, times=1)
        with pytest.raises(pynvml.NVMLError_Timeout):
            fake.nvmlDeviceGetPowerUsage(FakeHandle(0))
        assert fake.nvmlDeviceGetPowerUsage(FakeHandle(0)) == 350_000

    def test_an_injected_error_for_one_gpu_spares_the_others(self, fake: FakePynvml) -> None:
        fake.inject_error("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_TIMEOUT, index=1)
        assert fake.nvmlDeviceGetPowerUsage(FakeHandle(0)) == 350_000
        with pytest.raises(pynvml.NVMLError_Timeout):
            fake.nvmlDeviceGetPowerUsage(FakeHandle(1))

    def test_clock_commands_need_privilege(self) -> None:
        fake = FakePynvml(privileged=False)
        fake.nvmlInit()
        with pytest.raises(pynvml.NVMLError_NoPermission):
            fake.nvmlDeviceResetGpuLockedClocks(FakeHandle(0))
