"""Read-only checks of the NVML backend on a real NVIDIA GPU (opt in: ``EERL_TEST_GPU=1``).

Nothing here changes a GPU: no lock, no reset, no application clocks - only queries, so the tests are
safe on a node that is running jobs. Without ``EERL_TEST_GPU=1`` every test reports as skipped with the
reason, so a run without a GPU never counts them as passed.

Run on a GPU node: ``EERL_TEST_GPU=1 .venv/bin/pytest -m gpu tests/eerld/gpu/test_real_gpu.py``.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Iterator

import pytest

from eerld.gpu.base import ClockEventReasons, GpuBackend
from eerld.gpu.delegating import DelegatingBackend
from eerld.gpu.energy_sampler import SampledEnergyBackend
from eerld.gpu.nvml import NvmlBackend

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        os.environ.get("EERL_TEST_GPU") != "1",
        reason="opt-in: set EERL_TEST_GPU=1 on a machine with an NVIDIA GPU",
    ),
]

PCI_BUS_ID = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")


@pytest.fixture(scope="module")
def backend() -> Iterator[NvmlBackend]:
    with NvmlBackend() as b:
        yield b


@pytest.fixture(scope="module")
def gpu_indices(backend: NvmlBackend) -> list[int]:
    return [gpu.index for gpu in backend.inventory()]


class TestRealGpuReadOnly:
    def test_the_backend_meets_the_protocol(self, backend: NvmlBackend) -> None:
        assert isinstance(backend, GpuBackend)

    def test_inventory_lists_gpus_by_index_with_uuid_name_and_pci_bus_id(self, backend: NvmlBackend) -> None:
        gpus = list(backend.inventory())
        assert gpus, "EERL_TEST_GPU=1 but NVML sees no GPU"
        assert [g.index for g in gpus] == list(range(len(gpus)))
        assert len({g.uuid for g in gpus}) == len(gpus)
        for gpu in gpus:
            assert gpu.uuid.startswith(("GPU-", "MIG-"))
            assert gpu.name
            assert PCI_BUS_ID.match(gpu.pci_bus_id), gpu.pci_bus_id

    def test_supported_clocks_are_ascending_and_distinct(
        self, backend: NvmlBackend, gpu_indices: list[int]
    ) -> None:
        for index in gpu_indices:
            sm_clocks = list(backend.supported_sm_clocks_mhz(index))
            mem_clocks = list(backend.supported_mem_clocks_mhz(index))
            assert sm_clocks, f"GPU {index} reports no SM clocks"
            assert mem_clocks, f"GPU {index} reports no memory clocks"
            assert sm_clocks == sorted(set(sm_clocks))
            assert mem_clocks == sorted(set(mem_clocks))

    def test_current_clocks_lie_within_the_supported_range(
        self, backend: NvmlBackend, gpu_indices: list[int]
    ) -> None:
        for index in gpu_indices:
            clocks = backend.clocks(index)
            assert 0 < clocks.sm_clock_mhz <= max(backend.supported_sm_clocks_mhz(index))
            assert 0 < clocks.mem_clock_mhz <= max(backend.supported_mem_clocks_mhz(index))

    def test_the_energy_counter_does_not_go_backwards_between_two_reads(
        self, backend: NvmlBackend, gpu_indices: list[int]
    ) -> None:
        first_mj = [backend.total_energy_mj(i) for i in gpu_indices]
        time.sleep(0.2)
        second_mj = [backend.total_energy_mj(i) for i in gpu_indices]
        assert all(after >= before for before, after in zip(first_mj, second_mj, strict=True))

    def test_power_is_positive_and_the_limit_is_a_plausible_board_limit(
        self, backend: NvmlBackend, gpu_indices: list[int]
    ) -> None:
        for index in gpu_indices:
            assert backend.power_w(index) > 0.0
            assert 10.0 < backend.power_limit_w(index) < 5000.0

    def test_utilisation_is_a_percentage(self, backend: NvmlBackend, gpu_indices: list[int]) -> None:
        for index in gpu_indices:
            utilization = backend.utilization(index)
            assert 0 <= utilization.gpu_percent <= 100
            assert 0 <= utilization.memory_percent <= 100

    def test_clock_event_reasons_and_lock_support_can_be_read(
        self, backend: NvmlBackend, gpu_indices: list[int]
    ) -> None:
        for index in gpu_indices:
            assert isinstance(backend.clock_event_reasons(index), ClockEventReasons)
            assert isinstance(backend.supports_locked_clocks(index), bool)


class _CallerCountingBackend(DelegatingBackend):
    """Counts the energy-counter reads made on the thread that created it (not the sampler's threads)."""

    def __init__(self, inner: NvmlBackend) -> None:
        super().__init__(inner)
        self._caller = threading.get_ident()
        self.caller_energy_reads = 0

    def total_energy_mj(self, index: int) -> int:
        if threading.get_ident() == self._caller:
            self.caller_energy_reads += 1
        return super().total_energy_mj(index)


class TestSampledEnergyOnRealGpu:
    def test_sampled_energy_tracks_direct_reads_without_reading_the_counter_itself(self) -> None:
        """Over two seconds the background-sampled counter agrees with direct reads within 5% + 2 J, and its
        reads make no NVML energy call on the caller's thread (the point of sampling: that call is slow)."""
        with NvmlBackend() as direct:
            counting = _CallerCountingBackend(direct)
            sampled = SampledEnergyBackend(counting, period_s=0.02)
            try:
                time.sleep(0.3)
                direct_before, sampled_before = direct.total_energy_mj(0), sampled.total_energy_mj(0)
                time.sleep(2.0)
                direct_after, sampled_after = direct.total_energy_mj(0), sampled.total_energy_mj(0)
                direct_mj = direct_after - direct_before
                assert direct_mj > 0
                assert abs((sampled_after - sampled_before) - direct_mj) <= 0.05 * direct_mj + 2000
                reads = counting.caller_energy_reads
                for _ in range(20):
                    sampled.total_energy_mj(0)
                assert counting.caller_energy_reads == reads
            finally:
                sampled.close()
