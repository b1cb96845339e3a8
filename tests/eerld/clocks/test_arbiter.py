"""The clock arbiter (:mod:`eerld.clocks.arbiter`) built directly on fake GPUs and a ledger: no daemon, no
gRPC. Pin > session > default, the ledger written before a lock, the fail-safe resets, recovery, dry-run
and the rate limit."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from eerld.clocks.arbiter import RETRY_INITIAL_S, AppliedClock, ClockArbiter, ClockSource
from eerld.clocks.ledger import Ledger, LedgerEntry
from eerld.clocks.pins import Pin
from eerld.clocks.ratelimit import ClockChangeLimiter
from eerld.errors import GpuLost, NoPermission, NotSupported
from eerld.testing import FakeGpuBackend, ManualClock
from tests.security.test_failsafes import fill, tmpfs

ArbiterFactory = Callable[..., ClockArbiter]


@pytest.fixture
def arbiter_on() -> Iterator[ArbiterFactory]:
    """Build ``ClockArbiter(fake, Ledger(state), **kwargs)`` (creating ``state`` 0700); closed afterwards."""
    made: list[ClockArbiter] = []

    def make(fake: FakeGpuBackend, state: Path, **kwargs: Any) -> ClockArbiter:
        state.mkdir(mode=0o700, exist_ok=True)
        arbiter = ClockArbiter(fake, Ledger(state), **kwargs)
        made.append(arbiter)
        return arbiter

    yield make
    for arbiter in made:
        arbiter.close()


@pytest.fixture
def state(sock_dir: Path) -> Path:
    return sock_dir / "state"


def uuid_of(fake: FakeGpuBackend, index: int) -> str:
    return fake.gpus[index].identity.uuid


def pin_for(fake: FakeGpuBackend, index: int, sm_clock_mhz: int = 900, mem_clock_mhz: int = 0) -> Pin:
    return Pin(uuid_of(fake, index), sm_clock_mhz, mem_clock_mhz, "test", 1.7e9, 0.0)


def listed(state: Path) -> dict[int, str]:
    """The ledger on disk, as a new daemon would read it: index -> owner."""
    return {i: e.owner for i, e in Ledger(state).entries().items()}


def by_index(results: list[AppliedClock]) -> dict[int, AppliedClock]:
    return {r.index: r for r in results}


class TestSessions:
    def test_a_session_wish_locks_its_gpus_and_lists_them_in_the_ledger(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        results = by_index(arbiter.set_session([0, 2], "session-1", 1200))
        assert fake.locked() == {0: 1200, 2: 1200}
        assert listed(state) == {0: "session", 2: "session"}
        for index in (0, 2):
            assert results[index] == AppliedClock(
                index, uuid_of(fake, index), 1200, 1200, ClockSource.SESSION, False, ""
            )
            view = arbiter.view(index)
            assert (view.source, view.locked_sm_clock_mhz, view.session_id) == (
                ClockSource.SESSION,
                1200,
                "session-",
            )
        assert arbiter.view(1).source is ClockSource.DEFAULT

    def test_a_session_changes_its_clock_and_a_release_resets_the_gpu_and_unlists_it(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0], "s", 1200)
        arbiter.set_session([0], "s", 1500)
        assert fake.locked() == {0: 1500}
        [released] = arbiter.set_session([0], None, None)
        assert (released.source, released.requested_sm_clock_mhz) == (ClockSource.DEFAULT, None)
        assert fake.locked() == {}
        assert listed(state) == {}

    def test_between_its_phases_a_held_gpu_stays_listed_so_the_next_lock_writes_nothing(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        """A phase's end takes the clock back while the session still holds the GPU: the ledger keeps it, so
        neither that reset nor the next phase's lock waits for a write; the session's end unlists it."""
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0], "s", 1200)
        arbiter.set_session([0], "s", None)  # the phase ended
        assert fake.locked() == {}
        assert list(listed(state)) == [0]
        arbiter.set_session([0], "s", 1500)  # the next phase
        assert fake.locked() == {0: 1500}
        assert list(listed(state)) == [0]
        arbiter.set_session([0], None, None)
        assert listed(state) == {}

    def test_a_session_without_a_clock_leaves_its_gpu_at_the_default(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        [result] = arbiter.set_session([1], "s", None)
        assert result.source is ClockSource.DEFAULT
        assert fake.lock_calls() == 0
        assert listed(state) == {}

    def test_a_gpu_without_working_locks_gets_application_clocks_instead(
        self, arbiter_on: ArbiterFactory, clock: ManualClock, state: Path
    ) -> None:
        fake = FakeGpuBackend(1, clock=clock, locks_work=False)
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0], "s", 1200)
        assert (fake.locked(), fake.gpus[0].app_sm_mhz) == ({}, 1200)
        arbiter.set_session([0], None, None)
        assert fake.gpus[0].app_sm_mhz is None


class TestPinsWin:
    def test_a_pin_beats_the_session_until_it_is_cleared(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0, 1], "s", 1200)
        [pinned] = arbiter.set_pins([pin_for(fake, 0, 900)], [0])
        assert (pinned.source, pinned.sm_clock_mhz) == (ClockSource.ADMIN_PIN, 900)
        assert fake.locked() == {0: 900, 1: 1200}
        assert sorted(listed(state)) == [0, 1]  # already listed: the owner stays the first one's
        results = by_index(arbiter.set_session([0, 1], "s", 1500))
        assert fake.locked() == {0: 900, 1: 1500}
        assert results[0].source is ClockSource.ADMIN_PIN
        assert arbiter.view(0).pin == pin_for(fake, 0, 900)
        [cleared] = arbiter.clear_pins([0])
        assert (cleared.source, cleared.sm_clock_mhz) == (ClockSource.SESSION, 1500)
        assert fake.locked() == {0: 1500, 1: 1500}
        assert arbiter.view(0).pin is None

    def test_a_pin_on_a_gpu_without_a_session_is_cleared_to_the_default(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_pins([pin_for(fake, 2, 1005), pin_for(fake, 3, 1200)], [2, 3])
        assert fake.locked() == {2: 1005, 3: 1200}
        arbiter.clear_pins([2])
        assert fake.locked() == {3: 1200}
        assert listed(state) == {3: "admin_pin"}
        assert arbiter.view(2).source is ClockSource.DEFAULT

    def test_a_pin_with_a_memory_clock_locks_it_and_clearing_the_pin_resets_it(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_pins([pin_for(fake, 0, 900, mem_clock_mhz=1593)], [0])
        assert (fake.gpus[0].locked_sm_mhz, fake.gpus[0].locked_mem_mhz) == (900, 1593)
        arbiter.clear_pins([0])
        assert (fake.gpus[0].locked_sm_mhz, fake.gpus[0].locked_mem_mhz) == (None, None)

    def test_set_pins_needs_one_pin_per_index(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        with pytest.raises(ValueError, match="zip"):
            arbiter.set_pins([pin_for(fake, 0)], [0, 1])
        assert fake.locked() == {}


class TestResetEverything:
    def test_every_gpu_is_reset_every_wish_forgotten_and_the_ledger_emptied(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0, 1], "s", 1200)
        arbiter.set_pins([pin_for(fake, 2)], [2])
        fake.force_lock(3, 1500)  # behind the arbiter's back
        results = arbiter.reset_everything()
        assert sorted(r.index for r in results) == [0, 1, 2, 3]
        assert all(r.source is ClockSource.DEFAULT and r.degraded_reason == "" for r in results)
        assert fake.locked() == {}
        assert listed(state) == {}
        assert arbiter.view(2).pin is None
        assert arbiter.retry_degraded() == []
        assert fake.locked() == {}  # nothing re-applies the forgotten wishes

    def test_a_gpu_whose_reset_failed_stays_listed_and_degraded(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0, 1], "s", 1200)
        fake.fail(1, "reset_sm_clock", GpuLost("gone", gpu_index=1))
        results = by_index(arbiter.reset_everything())
        assert results[0].degraded_reason == ""
        assert "GpuLost" in results[1].degraded_reason
        assert fake.locked() == {1: 1200}
        assert listed(state) == {1: "session"}


class TestRecoverFromLedger:
    def test_the_gpus_a_previous_run_listed_are_reset_and_unlisted_and_the_others_left_alone(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        state.mkdir(mode=0o700)
        previous = Ledger(state)
        previous.add(LedgerEntry(1, uuid_of(fake, 1), "session"))
        previous.add(LedgerEntry(3, uuid_of(fake, 3), "admin_pin"))
        fake.force_lock(1, 1200)
        fake.force_lock(3, 900)
        fake.force_lock(2, 1500)  # not eerld's: not listed, so not touched
        arbiter = arbiter_on(fake, state)
        assert arbiter.recover_from_ledger() == [1, 3]
        assert fake.locked() == {2: 1500}
        assert listed(state) == {}

    def test_a_listed_gpu_this_node_does_not_have_is_dropped_from_the_ledger(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        state.mkdir(mode=0o700)
        Ledger(state).add(LedgerEntry(7, "GPU-gone", "session"))
        arbiter = arbiter_on(fake, state)
        assert arbiter.recover_from_ledger() == []
        assert listed(state) == {}

    def test_a_listed_gpu_whose_reset_fails_stays_listed_and_degraded(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        state.mkdir(mode=0o700)
        Ledger(state).add(LedgerEntry(0, uuid_of(fake, 0), "session"))
        fake.force_lock(0, 1200)
        fake.fail(0, "reset_sm_clock", GpuLost("gone", gpu_index=0))
        arbiter = arbiter_on(fake, state)
        assert arbiter.recover_from_ledger() == []
        assert listed(state) == {0: "session"}
        assert "GpuLost" in arbiter.view(0).degraded_reason

    def test_an_empty_ledger_resets_nothing(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        fake.force_lock(0, 1200)
        arbiter = arbiter_on(fake, state)
        assert arbiter.recover_from_ledger() == []
        assert fake.locked() == {0: 1200}
        assert fake.gpus[0].reset_calls == 0


class TestDryRun:
    def test_a_dry_run_arbiter_decides_but_never_locks_resets_or_writes_the_ledger(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state, dry_run=True)
        assert arbiter.dry_run
        began = by_index(arbiter.set_session([0, 1], "s", 1200))
        pinned = by_index(arbiter.set_pins([pin_for(fake, 1, 900, mem_clock_mhz=1593)], [1]))
        assert all(r.dry_run for r in [*began.values(), *pinned.values()])
        assert (began[0].requested_sm_clock_mhz, pinned[1].requested_sm_clock_mhz) == (1200, 900)
        assert (arbiter.view(0).would_lock_sm_clock_mhz, arbiter.view(1).would_lock_sm_clock_mhz) == (
            1200,
            900,
        )
        assert arbiter.view(0).locked_sm_clock_mhz is None
        arbiter.clear_pins([1])
        arbiter.set_session([0, 1], None, None)
        arbiter.release_all()
        assert fake.lock_calls() == 0
        assert [g.reset_calls for g in fake.gpus] == [0, 0, 0, 0]
        assert fake.locked() == {}
        assert not (state / "ledger.json").exists()

    def test_a_dry_run_arbiter_leaves_the_locks_a_sound_ledger_names(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        state.mkdir(mode=0o700)
        Ledger(state).add(LedgerEntry(0, uuid_of(fake, 0), "session"))
        fake.force_lock(0, 1800)
        arbiter = arbiter_on(fake, state, dry_run=True)
        assert arbiter.recover_from_ledger() == []
        assert fake.locked() == {0: 1800}
        assert listed(state) == {0: "session"}

    def test_the_view_shows_no_would_lock_outside_dry_run(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state)
        arbiter.set_session([0], "s", 1200)
        assert arbiter.view(0).would_lock_sm_clock_mhz is None


class TestDegradedRetry:
    def test_a_failed_lock_degrades_only_its_gpu_and_is_retried_after_the_back_off(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, clock: ManualClock, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state, clock=clock)
        fake.fail(1, "lock_sm_clock", NoPermission("not root", gpu_index=1))
        results = by_index(arbiter.set_session([0, 1], "s", 1200))
        assert results[0].degraded_reason == ""
        assert results[1].degraded_reason == "NoPermission: not root"
        assert fake.locked() == {0: 1200}
        assert listed(state) == {0: "session", 1: "session"}  # listed before the lock that failed
        fake.heal(1)
        assert arbiter.retry_degraded() == []  # the back-off has not passed
        clock.advance(RETRY_INITIAL_S)
        [retried] = arbiter.retry_degraded()
        assert (retried.index, retried.degraded_reason, retried.sm_clock_mhz) == (1, "", 1200)
        assert fake.locked() == {0: 1200, 1: 1200}
        assert arbiter.view(1).degraded_reason == ""

    def test_the_back_off_doubles_while_the_gpu_keeps_failing(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, clock: ManualClock, state: Path
    ) -> None:
        arbiter = arbiter_on(fake, state, clock=clock)
        fake.fail(0, "lock_sm_clock", GpuLost("gone", gpu_index=0))
        arbiter.set_session([0], "s", 1200)
        clock.advance(RETRY_INITIAL_S)
        assert len(arbiter.retry_degraded()) == 1  # fails again: the next wait is twice as long
        clock.advance(RETRY_INITIAL_S)
        assert arbiter.retry_degraded() == []
        clock.advance(RETRY_INITIAL_S)
        assert len(arbiter.retry_degraded()) == 1


class TestRateLimit:
    def test_a_session_change_over_the_limit_keeps_the_clock_that_holds(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, clock: ManualClock, state: Path
    ) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=1)
        arbiter = arbiter_on(fake, state, clock=clock, change_limiter=limiter)
        arbiter.set_session([0], "s", 1200)
        [skipped] = arbiter.set_session([0], "s", 1500)
        assert (skipped.requested_sm_clock_mhz, skipped.sm_clock_mhz, skipped.degraded_reason) == (
            1500,
            1200,
            "",
        )
        assert fake.locked() == {0: 1200}
        assert arbiter.over_rate([0, 1]) == [0]
        clock.advance(1.0)
        arbiter.set_session([0], "s", 1500)
        assert fake.locked() == {0: 1500}

    def test_a_release_over_the_limit_still_resets(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, clock: ManualClock, state: Path
    ) -> None:
        limiter = ClockChangeLimiter(rate_per_s=1.0, burst=1)
        arbiter = arbiter_on(fake, state, clock=clock, change_limiter=limiter)
        arbiter.set_session([0], "s", 1200)
        arbiter.set_session([0], None, None)
        assert fake.locked() == {}
        assert listed(state) == {}


class TestFailSafeResets:
    """The fail-safe paths reset the hardware whatever the arbiter believes; the hot path skips no-ops."""

    def test_a_release_resets_a_lock_set_behind_the_arbiters_back(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        arbiter = arbiter_on(fake, sock_dir / "state")
        arbiter.set_session([0], "s", None)
        fake.force_lock(0, 1200)
        arbiter.set_session([0], None, None)
        assert fake.locked() == {}

    def test_a_session_wish_that_holds_already_makes_no_backend_call(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        arbiter = arbiter_on(fake, sock_dir / "state")
        arbiter.set_session([0], "s", 1200)
        resets = fake.gpus[0].reset_calls
        for _ in range(3):
            arbiter.set_session([0], "s", 1200)
        assert (fake.lock_calls(), fake.gpus[0].reset_calls) == (1, resets)

    def test_unpin_and_release_all_reset_application_clocks_and_memory_locks_another_tool_left(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        arbiter = arbiter_on(fake, sock_dir / "state")
        fake.set_application_clocks(1, 1593, 900)
        fake.lock_mem_clock(1, 1593)
        arbiter.clear_pins([1])
        assert (fake.gpus[1].app_sm_mhz, fake.gpus[1].locked_mem_mhz) == (None, None)
        fake.force_lock(2, 1500)
        fake.force_lock(3, 1500)
        arbiter.release_all()
        assert fake.locked() == {}

    def test_a_gpu_whose_own_reset_is_not_supported_stays_degraded_and_listed(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        arbiter = arbiter_on(fake, sock_dir / "state")
        arbiter.set_session([0], "s", 1200)
        fake.fail(0, "reset_sm_clock", NotSupported("no", gpu_index=0))
        [result] = arbiter.set_session([0], None, None)
        assert "NotSupported" in result.degraded_reason
        assert fake.locked() == {0: 1200}
        assert list(Ledger(sock_dir / "state").entries()) == [0]

    def test_a_reset_of_another_kind_that_is_not_supported_is_skipped(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        arbiter = arbiter_on(fake, sock_dir / "state")
        fake.fail(0, "reset_application_clocks", NotSupported("no", gpu_index=0))
        fake.force_lock(0, 1200)
        assert arbiter.release_all()[0].degraded_reason == ""
        assert fake.locked() == {}


class TestLedgerFailures:
    def test_a_lock_whose_record_cannot_be_written_is_not_taken(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        with tmpfs(sock_dir / "state") as state:
            arbiter = arbiter_on(fake, state)
            filler = fill(state)
            [result] = arbiter.set_session([0], "s", 1200)
            assert result.degraded_reason.startswith("ledger write failed")
            assert fake.locked() == {}
            arbiter.set_session([0], "s", 1200)  # a retry finds no record: still no lock
            assert fake.locked() == {}
            filler.unlink()
            arbiter.set_session([0], "s", 1200)
            assert fake.locked() == {0: 1200}
            assert list(Ledger(state).entries()) == [0]

    def test_a_release_that_cannot_write_the_ledger_still_resets_and_the_removal_is_retried(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        with tmpfs(sock_dir / "state") as state:
            arbiter = arbiter_on(fake, state)
            arbiter.set_session([0], "s", 1200)
            filler = fill(state)
            [result] = arbiter.set_session([0], None, None)
            assert result.degraded_reason == ""
            assert fake.locked() == {}
            assert list(Ledger(state).entries()) == [0]
            filler.unlink()
            arbiter.retry_degraded()
            assert list(Ledger(state).entries()) == []


class TestCorruptLedgerAtStart:
    def test_every_gpu_is_reset_and_the_ledger_set_aside(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        (state / "ledger.json").write_text('{"locked": [{"index": "x"}]}')
        fake.force_lock(1, 1200)
        fake.force_lock(3, 900)
        arbiter = arbiter_on(fake, state)
        assert arbiter.recover_from_ledger() == [0, 1, 2, 3]
        assert fake.locked() == {}
        assert [p.name.startswith("ledger.json.corrupt-") for p in state.iterdir()] == [True]

    def test_a_gpu_whose_reset_failed_is_listed_in_the_fresh_ledger(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        (state / "ledger.json").write_text("not json")
        fake.fail(2, "reset_sm_clock", GpuLost("gone", gpu_index=2))
        arbiter = arbiter_on(fake, state)
        assert arbiter.recover_from_ledger() == [0, 1, 3]
        assert list(Ledger(state).entries()) == [2]

    def test_a_dry_run_arbiter_leaves_a_corrupt_ledger_and_every_lock_alone(
        self, arbiter_on: ArbiterFactory, fake: FakeGpuBackend, sock_dir: Path
    ) -> None:
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        (state / "ledger.json").write_text("not json")
        fake.force_lock(0, 1200)
        arbiter = arbiter_on(fake, state, dry_run=True)
        assert arbiter.recover_from_ledger() == []
        assert fake.locked() == {0: 1200}
        assert (state / "ledger.json").read_text() == "not json"
