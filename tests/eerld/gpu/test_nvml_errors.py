"""Every NVML return code becomes the typed eerld error the mapping promises, at every public method."""

from __future__ import annotations

from collections.abc import Callable

import pynvml
import pytest

from eerld.errors import BackendFailure, GpuError, GpuLost, InvalidArgument, NoPermission, NotSupported
from eerld.gpu.nvml import ERROR_CLASS_BY_NVML_NAME, NvmlBackend
from tests.eerld.gpu.fake_pynvml import NVML_ERROR_CODES, FakePynvml, make_gpus

# The mapping as specified in docs/nvml.md. Codes not listed are BackendFailure.
EXPECTED: dict[str, type[GpuError]] = {
    "NVML_ERROR_INVALID_ARGUMENT": InvalidArgument,
    "NVML_ERROR_FREQ_NOT_SUPPORTED": InvalidArgument,
    "NVML_ERROR_NOT_SUPPORTED": NotSupported,
    "NVML_ERROR_FUNCTION_NOT_FOUND": NotSupported,
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": NotSupported,
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": NotSupported,
    "NVML_ERROR_DEPRECATED": NotSupported,
    "NVML_ERROR_INVALID_STATE": NotSupported,
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": NotSupported,
    "NVML_ERROR_NO_PERMISSION": NoPermission,
    "NVML_ERROR_OPERATING_SYSTEM": NoPermission,
    "NVML_ERROR_GPU_IS_LOST": GpuLost,
    "NVML_ERROR_RESET_REQUIRED": GpuLost,
    "NVML_ERROR_GPU_NOT_FOUND": GpuLost,
}


def expected_class(name: str) -> type[GpuError]:
    return EXPECTED.get(name, BackendFailure)


CODES = sorted(NVML_ERROR_CODES.items(), key=lambda item: item[1])


class TestErrorTable:
    def test_every_name_in_the_table_is_a_real_nvml_error_code(self) -> None:
        assert set(ERROR_CLASS_BY_NVML_NAME) <= set(NVML_ERROR_CODES)

    @pytest.mark.parametrize(("name", "code"), CODES, ids=[name for name, _ in CODES])
    def test_each_code_becomes_its_typed_error_carrying_the_gpu_the_call_and_nvml_text(
        self, name: str, code: int
    ) -> None:
        fake = FakePynvml(make_gpus(2))
        fake.inject_error("nvmlDeviceGetPowerUsage", code, index=1)
        backend = NvmlBackend(fake)
        with pytest.raises(GpuError) as info:
            backend.power_w(1)
        error = info.value
        assert type(error) is expected_class(name)
        assert error.gpu_index == 1
        assert str(error).startswith("nvmlDeviceGetPowerUsage failed on GPU 1: ")
        assert f"({name} = {code})" in str(error)
        assert isinstance(error.__cause__, pynvml.NVMLError)
        assert error.__cause__.value == code

    @pytest.mark.parametrize(("name", "code"), CODES, ids=[name for name, _ in CODES])
    def test_each_code_at_initialisation_becomes_its_typed_error_without_a_gpu(
        self, name: str, code: int
    ) -> None:
        fake = FakePynvml()
        fake.inject_error("nvmlInit", code)
        with pytest.raises(GpuError, match=r"^nvmlInit failed on this node") as info:
            NvmlBackend(fake)
        assert type(info.value) is expected_class(name)
        assert info.value.gpu_index is None

    def test_a_code_nvml_adds_later_is_a_backend_failure_naming_the_code(self) -> None:
        fake = FakePynvml()
        fake.inject_error("nvmlDeviceGetPowerUsage", 4242)
        with pytest.raises(BackendFailure, match=r"an unknown NVML code = 4242") as info:
            NvmlBackend(fake).power_w(0)
        assert info.value.__cause__ is not None

    def test_the_error_only_hits_the_gpu_it_was_raised_for(self) -> None:
        fake = FakePynvml(make_gpus(2))
        fake.inject_error("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_GPU_IS_LOST, index=1)
        assert NvmlBackend(fake).power_w(0) == pytest.approx(350.0)


PER_GPU_CALLS: list[tuple[str, Callable[[NvmlBackend], object]]] = [
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
IDS = [name for name, _ in PER_GPU_CALLS]

MUTATING_CALLS = [
    (name, call)
    for name, call in PER_GPU_CALLS
    if name.startswith(("lock_", "reset_", "set_"))  # the ones that change GPU state
]


class TestEveryMethodTranslatesErrors:
    @pytest.mark.parametrize(("method", "call"), PER_GPU_CALLS, ids=IDS)
    def test_a_gpu_that_fell_off_the_bus_is_gpu_lost(
        self, method: str, call: Callable[[NvmlBackend], object]
    ) -> None:
        fake = FakePynvml(make_gpus(2))
        backend = NvmlBackend(fake)
        fake.gpus[1].lost = True
        with pytest.raises(GpuLost, match=r"failed on GPU 1: GPU is lost") as info:
            call(backend)
        assert info.value.gpu_index == 1

    @pytest.mark.parametrize(("method", "call"), PER_GPU_CALLS, ids=IDS)
    def test_an_uninitialised_library_is_a_backend_failure(
        self, method: str, call: Callable[[NvmlBackend], object]
    ) -> None:
        fake = FakePynvml(make_gpus(2))
        backend = NvmlBackend(fake)
        fake.init_count = 0  # someone else shut NVML down under us
        with pytest.raises(BackendFailure, match="NVML_ERROR_UNINITIALIZED"):
            call(backend)

    @pytest.mark.parametrize(("method", "call"), MUTATING_CALLS, ids=[m for m, _ in MUTATING_CALLS])
    def test_without_root_every_change_is_no_permission(
        self, method: str, call: Callable[[NvmlBackend], object]
    ) -> None:
        backend = NvmlBackend(FakePynvml(make_gpus(2), privileged=False))
        with pytest.raises(NoPermission, match="Insufficient Permissions") as info:
            call(backend)
        assert info.value.gpu_index == 1

    def test_inventory_translates_errors_with_the_gpu_concerned(self) -> None:
        fake = FakePynvml(make_gpus(2))
        fake.gpus[1].lost = True
        with pytest.raises(GpuLost, match="failed on GPU 1: GPU is lost") as info:
            NvmlBackend(fake).inventory()
        assert info.value.gpu_index == 1

    def test_inventory_translates_a_failed_count_without_a_gpu(self) -> None:
        fake = FakePynvml()
        fake.inject_error("nvmlDeviceGetCount", pynvml.NVML_ERROR_UNKNOWN)
        with pytest.raises(
            BackendFailure, match="nvmlDeviceGetCount failed on this node: Unknown Error"
        ) as info:
            NvmlBackend(fake).inventory()
        assert info.value.gpu_index is None

    def test_a_failing_shutdown_is_translated_and_the_backend_still_counts_as_closed(self) -> None:
        fake = FakePynvml()
        backend = NvmlBackend(fake)
        fake.inject_error("nvmlShutdown", pynvml.NVML_ERROR_DRIVER_NOT_LOADED, times=1)
        with pytest.raises(BackendFailure, match="nvmlShutdown"):
            backend.close()
        backend.close()
        assert [name for name, _ in fake.calls].count("nvmlShutdown") == 1
