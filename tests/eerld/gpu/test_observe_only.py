"""The observe-only wrapper behind --dry-run: reads pass through, every clock change is refused."""

from __future__ import annotations

import pytest

from eerld.errors import NoPermission
from eerld.gpu.observe_only import ObserveOnlyBackend
from eerld.testing import FakeGpuBackend, ManualClock

MUTATORS = [
    ("lock_sm_clock", (0, 1200)),
    ("reset_sm_clock", (0,)),
    ("lock_mem_clock", (0, 2619)),
    ("reset_mem_clock", (0,)),
    ("set_application_clocks", (0, 2619, 1200)),
    ("reset_application_clocks", (0,)),
]


@pytest.fixture
def fake() -> FakeGpuBackend:
    return FakeGpuBackend(gpus=2, clock=ManualClock())


@pytest.mark.parametrize(("method", "args"), MUTATORS)
def test_every_clock_change_is_refused_before_it_reaches_the_gpu(
    fake: FakeGpuBackend, method: str, args: tuple[int, ...]
) -> None:
    fake.force_lock(0, 1500)
    with pytest.raises(NoPermission, match="dry-run") as e:
        getattr(ObserveOnlyBackend(fake), method)(*args)
    assert e.value.gpu_index == 0
    assert fake.locked() == {0: 1500}
    assert fake.lock_calls() == 0


def test_reads_are_the_wrapped_backends(fake: FakeGpuBackend) -> None:
    wrapped = ObserveOnlyBackend(fake)
    assert wrapped.name == fake.name
    assert list(wrapped.inventory()) == list(fake.inventory())
    assert list(wrapped.supported_sm_clocks_mhz(1)) == list(fake.supported_sm_clocks_mhz(1))
    assert list(wrapped.supported_mem_clocks_mhz(1)) == list(fake.supported_mem_clocks_mhz(1))
    assert wrapped.clocks(1) == fake.clocks(1)
    assert wrapped.supports_locked_clocks(1) == fake.supports_locked_clocks(1)
    assert wrapped.total_energy_mj(1) == fake.total_energy_mj(1)
    assert wrapped.power_w(1) == fake.power_w(1)
    assert wrapped.power_limit_w(1) == fake.power_limit_w(1)
    assert wrapped.utilization(1) == fake.utilization(1)
    assert wrapped.clock_event_reasons(1) == fake.clock_event_reasons(1)
