"""The claim gate (:mod:`eerld.daemon.gate`): the drains in force, and a new drain or shutdown ordered
against the claims in flight, with the gate's own lock and no other."""

from __future__ import annotations

import threading

import pytest

from eerld.daemon.drains import Drain
from eerld.daemon.gate import ClaimGate
from eerld.daemon.inventory import Inventory
from eerld.daemon.lifecycle import LifeCycle
from eerld.errors import Conflict, Unavailable
from eerld.testing import FakeGpuBackend, ManualClock

WAIT_S = 10.0


@pytest.fixture
def inventory(fake: FakeGpuBackend) -> Inventory:
    return Inventory(fake)


@pytest.fixture
def life() -> LifeCycle:
    return LifeCycle()


@pytest.fixture
def gate(inventory: Inventory, life: LifeCycle, clock: ManualClock) -> ClaimGate:
    return ClaimGate(inventory, life, wall_clock=clock)


def drain(inventory: Inventory, index: int, clock: ManualClock, duration_s: float = 0.0) -> tuple[int, Drain]:
    expires = clock() + duration_s if duration_s > 0 else 0.0
    return index, Drain(inventory.uuid(index), "maint", clock(), expires, set_by="root")


class TestDrains:
    def test_a_drained_gpu_refuses_a_check_and_a_claim_naming_the_drain(
        self, gate: ClaimGate, inventory: Inventory, clock: ManualClock
    ) -> None:
        gate.drain([drain(inventory, 1, clock)])
        gate.check([0, 2])
        message = r"gpus: GPU 1 is drained until undrained, by root: maint; no session may claim it"
        with pytest.raises(Conflict, match=message):
            gate.check([0, 1])
        with pytest.raises(Conflict, match=message), gate.claim([1]):
            pass
        assert gate.drain_of(1) is not None
        assert gate.drain_of(0) is None

    def test_undrain_returns_the_drains_it_ended_and_expire_those_whose_time_is_up(
        self, gate: ClaimGate, inventory: Inventory, clock: ManualClock
    ) -> None:
        gate.drain([drain(inventory, 0, clock), drain(inventory, 1, clock, duration_s=5.0)])
        assert [d.uuid for d in gate.undrain([0, 2])] == [inventory.uuid(0)]
        assert gate.expire() == []
        clock.advance(5.0)
        assert gate.drain_of(1) is None  # expired: no longer in force, even before the tick removes it
        assert [d.uuid for d in gate.expire()] == [inventory.uuid(1)]


class TestOrdering:
    def test_a_claim_is_refused_once_the_life_cycle_stopped(self, gate: ClaimGate, life: LifeCycle) -> None:
        life.stop()
        with pytest.raises(Unavailable, match="eerld is stopping"), gate.claim([0]):
            pass

    def test_a_drain_waits_for_a_claim_of_its_gpus_in_flight_and_no_other(
        self, gate: ClaimGate, inventory: Inventory, clock: ManualClock
    ) -> None:
        in_flight, release, drained = threading.Event(), threading.Event(), threading.Event()

        def claim() -> None:
            with gate.claim([0]):
                in_flight.set()
                release.wait(WAIT_S)

        claimer = threading.Thread(target=claim)
        claimer.start()
        assert in_flight.wait(WAIT_S)
        gate.drain([drain(inventory, 1, clock)])  # another GPU: at once
        drainer = threading.Thread(target=lambda: (gate.drain([drain(inventory, 0, clock)]), drained.set()))
        drainer.start()
        assert not drained.wait(0.2)  # the claim of GPU 0 is still in flight
        with pytest.raises(Conflict):
            gate.check([0])  # recorded already: no new claim gets in
        release.set()
        assert drained.wait(WAIT_S)
        claimer.join(WAIT_S)
        drainer.join(WAIT_S)

    def test_settle_waits_until_no_claim_is_in_flight(self, gate: ClaimGate) -> None:
        in_flight, release, settled = threading.Event(), threading.Event(), threading.Event()

        def claim() -> None:
            with gate.claim([2, 3]):
                in_flight.set()
                release.wait(WAIT_S)

        claimer = threading.Thread(target=claim)
        claimer.start()
        assert in_flight.wait(WAIT_S)
        settler = threading.Thread(target=lambda: (gate.settle(), settled.set()))
        settler.start()
        assert not settled.wait(0.2)
        release.set()
        assert settled.wait(WAIT_S)
        claimer.join(WAIT_S)
        settler.join(WAIT_S)

    def test_a_claim_that_raises_is_no_longer_in_flight(self, gate: ClaimGate) -> None:
        with pytest.raises(RuntimeError), gate.claim([0]):
            raise RuntimeError("redeem failed")
        gate.settle()  # returns at once
