"""The clock arbiter: for each GPU, an admin pin beats the holding session's controller beats the default.

The arbiter is the only code that actuates clocks. Every change goes through :meth:`ClockArbiter._apply`,
which (1) computes the GPU's target from pin > session > default, (2) skips the call when the target holds
already, (3) lists the GPU in the ledger before any lock — durably: a lock whose record cannot be written
(a full disk) is not taken —, (4) locks or resets, (5) unlists it after a reset (a failed removal keeps the
GPU listed, the safe direction, and is retried by :meth:`ClockArbiter.retry_degraded`). A backend or ledger
error marks only that GPU degraded (with the reason) and schedules a retry with back-off; one decision is
applied to many GPUs in parallel so that a slow or failing GPU never holds up the others.

Skipping a target that holds already is for the hot path (a session's phase changes) only. The fail-safe
paths — a session releasing its GPUs, an admin pin removed or reset, shutdown, a degraded GPU retried,
recovery at start, ``--reset-clocks`` — never trust the arbiter's own view: a lock set behind its back
(another tool, a reset that failed silently) is invisible to it, so they call the backend's resets
(:func:`reset_gpu_clocks`: SM lock, application clocks, memory lock) whatever it believes.
"""

from __future__ import annotations

import enum
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass

import structlog

from eerld.clocks.ledger import Ledger, LedgerEntry
from eerld.clocks.pins import Pin
from eerld.clocks.ratelimit import ClockChangeLimiter
from eerld.errors import ConfigError, GpuError, NotSupported
from eerld.gpu.base import GpuBackend, GpuIdentity

log = structlog.get_logger("eerld.clocks")

RETRY_INITIAL_S = 0.5
RETRY_MAX_S = 30.0
APPLY_TIMEOUT_S = 10.0


def reset_gpu_clocks(backend: GpuBackend, index: int, *, locks_work: bool) -> None:
    """Give every clock setting of GPU ``index`` back to the driver, whoever set it.

    The SM clock lock, the application clocks and the memory clock lock, each tried even when another
    failed; the first error is raised. The GPU's own actuator (the lock, or application clocks where
    ``locks_work`` is False) must reset, ``NotSupported`` included; for the others ``NotSupported`` means
    nothing of that kind can be set, so it is skipped.
    """
    sm_resets = (backend.reset_sm_clock, backend.reset_application_clocks)
    primary, secondary = sm_resets if locks_work else sm_resets[::-1]
    first: GpuError | None = None
    for reset, required in ((primary, True), (secondary, False), (backend.reset_mem_clock, False)):
        try:
            reset(index)
        except NotSupported as e:
            if required:
                first = first or e
        except GpuError as e:
            first = first or e
    if first is not None:
        raise first


def locks_work_on(backend: GpuBackend, index: int) -> bool:
    """Whether GPU ``index`` takes SM clock locks (True when the query itself fails: the default actuator)."""
    try:
        return backend.supports_locked_clocks(index)
    except GpuError:
        return True


def error_reason(error: BaseException) -> str:
    """A degraded reason: ``Kind: message`` for a backend error, the ledger's words for a failed write."""
    if isinstance(error, OSError):
        return f"ledger write failed: {error.strerror or error}"
    if isinstance(error, ConfigError):
        return f"ledger unusable: {error}"
    return f"{type(error).__name__}: {error}"


class ClockSource(enum.StrEnum):
    """Who decides a GPU's clock now."""

    DEFAULT = "default"
    SESSION = "session"
    ADMIN_PIN = "admin_pin"


@dataclass(frozen=True, slots=True)
class AppliedClock:
    """The outcome of applying the arbiter's target to one GPU."""

    index: int
    uuid: str
    sm_clock_mhz: int
    """Read back after the change; 0 when it could not be read."""
    requested_sm_clock_mhz: int | None
    """The lock asked for; None for the default governor."""
    source: ClockSource
    dry_run: bool
    degraded_reason: str


@dataclass(frozen=True, slots=True)
class Arbitration:
    """The arbiter's view of one GPU, for Status."""

    index: int
    uuid: str
    source: ClockSource
    pin: Pin | None
    session_id: str | None
    locked_sm_clock_mhz: int | None
    would_lock_sm_clock_mhz: int | None
    degraded_reason: str


class _RateRule(enum.Enum):
    """What the clock-change rate limit does with one change (:meth:`_Slot.rate_rule`)."""

    EXEMPT = "made anyway, taking a token"
    SAME = "no change: nothing to limit"
    LIMITED = "made only if a token is left"


class _Slot:
    """Mutable per-GPU state; guarded by its own lock so GPUs never wait on each other."""

    def __init__(self, identity: GpuIdentity, locks_work: bool, max_mem_clock_mhz: int) -> None:
        self.identity = identity
        self.locks_work = locks_work
        self.max_mem_clock_mhz = max_mem_clock_mhz
        self.lock = threading.Lock()
        self.pin: Pin | None = None
        self.session_id: str | None = None
        self.log_session_id = ""
        """The session named in logs: the holder, or the one that just released the GPU."""
        self.session_clock_mhz: int | None = None
        self.applied_sm_mhz: int | None = None
        self.applied_mem_mhz: int | None = None
        self.would_lock_mhz: int | None = None
        self.degraded_reason = ""
        self.retry_at_s = 0.0
        self.backoff_s = RETRY_INITIAL_S

    def rate_rule(self, target_sm: int | None, source: ClockSource, *, force: bool) -> _RateRule:
        """The one rate-limit rule for a change of this GPU to ``target_sm`` from ``source``.

        Only a session's lock to another clock, on a healthy GPU and not forced, waits for a token
        (:attr:`_RateRule.LIMITED`); every other change (a reset, a pin, a forced or retried application) is
        made anyway but takes its token (:attr:`_RateRule.EXEMPT`), so that resets cannot be used to thrash a
        GPU between locks; a session's wish for the clock it holds changes nothing (:attr:`_RateRule.SAME`).
        """
        if source is not ClockSource.SESSION or target_sm is None or force or self.degraded_reason:
            return _RateRule.EXEMPT
        return _RateRule.SAME if target_sm == self.applied_sm_mhz else _RateRule.LIMITED

    def target(self) -> tuple[int | None, int | None, ClockSource]:
        if self.pin is not None:
            mem = self.pin.mem_clock_mhz or None
            return self.pin.sm_clock_mhz, mem, ClockSource.ADMIN_PIN
        if self.session_id is not None and self.session_clock_mhz is not None:
            return self.session_clock_mhz, None, ClockSource.SESSION
        return None, None, ClockSource.DEFAULT


class ClockArbiter:
    """Applies pin > session > default to each GPU, crash-safely and in parallel."""

    def __init__(
        self,
        backend: GpuBackend,
        ledger: Ledger,
        *,
        dry_run: bool = False,
        clock: Callable[[], float] = time.monotonic,
        max_workers: int = 8,
        apply_timeout_s: float = APPLY_TIMEOUT_S,
        change_limiter: ClockChangeLimiter | None = None,
    ) -> None:
        self._backend = backend
        self._limiter = change_limiter if change_limiter is not None else ClockChangeLimiter()
        self._apply_timeout_s = apply_timeout_s
        self._ledger = ledger
        self._dry_run = dry_run
        self._clock = clock
        self._slots: dict[int, _Slot] = {}
        for identity in backend.inventory():
            self._slots[identity.index] = self._make_slot(identity)
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="eerld-clocks")

    def _make_slot(self, identity: GpuIdentity) -> _Slot:
        locks_work = locks_work_on(self._backend, identity.index)
        try:
            mems = self._backend.supported_mem_clocks_mhz(identity.index)
            max_mem = max(mems) if mems else 0
        except GpuError:
            max_mem = 0
        return _Slot(identity, locks_work, max_mem)

    @property
    def dry_run(self) -> bool:
        """True when no clock is ever actuated."""
        return self._dry_run

    def close(self) -> None:
        """Stop the worker threads."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- recovery -----------------------------------------------------------------------------------

    def recover_from_ledger(self) -> list[int]:
        """Reset every GPU the ledger names (locks left by a dead daemon); return the indices reset.

        A corrupt ledger names nothing that can be trusted: every GPU of the node is reset, then the file
        is set aside (``ledger.json.corrupt-<unix time>``); a GPU whose reset failed is listed in the fresh
        ledger so that its retry (and the next start) resets it.
        """
        reset: list[int] = []
        if self._dry_run:
            # A dry-run daemon never touches a clock: leave the locks and the ledger to a real daemon.
            if self._ledger.corrupt:
                log.warning("ledger_corrupt_left_in_dry_run", reason=self._ledger.corrupt)
                return reset
            for index, entry in sorted(self._ledger.entries().items()):
                log.warning("ledger_lock_left_in_dry_run", gpu_index=index, gpu_uuid=entry.uuid)
            return reset
        if self._ledger.corrupt:
            return [r.index for r in self._recover_from_corrupt_ledger() if not r.degraded_reason]
        for index, entry in sorted(self._ledger.entries().items()):
            slot = self._slots.get(index)
            if slot is None:
                log.warning("ledger_gpu_unknown", gpu_index=index, gpu_uuid=entry.uuid)
                self._ledger.remove(index)
                continue
            with slot.lock:
                if self._reset_hardware(slot, reason="ledger recovery at start"):
                    self._unlist(slot)
                    reset.append(index)
                    log.info("ledger_reset", gpu_index=index, gpu_uuid=entry.uuid, owner=entry.owner)
        return reset

    def _recover_from_corrupt_ledger(self) -> list[AppliedClock]:
        """Reset every GPU, then set the corrupt ledger aside and list the GPUs whose reset failed."""
        results = self._map(list(self._slots), self._force_reset_unlisted)
        try:
            self._ledger.set_aside()
        except OSError as e:
            log.error("ledger_set_aside_failed", path=str(self._ledger.path), reason=e.strerror or str(e))
            return results
        for result in results:
            if result.degraded_reason:
                try:
                    self._ledger.add(LedgerEntry(result.index, result.uuid, "recovery"))
                except OSError as e:
                    log.warning("ledger_write_failed", gpu_index=result.index, reason=error_reason(e))
        return results

    def _force_reset_unlisted(self, slot: _Slot) -> AppliedClock:
        with slot.lock:
            self._reset_hardware(slot, reason="the ledger is corrupt: every GPU is reset")
            return self._result(slot, None, ClockSource.DEFAULT, None)

    def reset_everything(self) -> list[AppliedClock]:
        """Reset every GPU of the node regardless of state; the ledger lists only those whose reset failed."""
        for slot in self._slots.values():
            with slot.lock:
                slot.pin = None
                slot.session_id = None
                slot.session_clock_mhz = None
        if self._ledger.corrupt and not self._dry_run:
            return self._recover_from_corrupt_ledger()
        return self._map(list(self._slots), self._force_reset)

    def _force_reset(self, slot: _Slot) -> AppliedClock:
        with slot.lock:
            if self._reset_hardware(slot, reason="reset requested"):
                self._unlist(slot)
            return self._result(slot, None, ClockSource.DEFAULT, None)

    # -- requests -----------------------------------------------------------------------------------

    def set_session(
        self, indices: Sequence[int], session_id: str | None, sm_clock_mhz: int | None
    ) -> list[AppliedClock]:
        """Record the session's wish for its GPUs (None session: released) and apply it.

        A session's own changes skip a target that holds already (the hot path); a release resets the
        hardware whatever the arbiter believes (fail-safe).
        """

        def update(slot: _Slot) -> None:
            slot.log_session_id = (session_id or slot.session_id or "")[:8]
            slot.session_id = session_id
            slot.session_clock_mhz = sm_clock_mhz if session_id is not None else None

        return self._update_and_apply(indices, update, force=session_id is None)

    def set_pins(self, pins: Sequence[Pin], indices: Sequence[int]) -> list[AppliedClock]:
        """Install pins (one per index, same order) and apply them."""
        by_index = dict(zip(indices, pins, strict=True))

        def update(slot: _Slot) -> None:
            slot.pin = by_index[slot.identity.index]

        return self._update_and_apply(indices, update)

    def clear_pins(self, indices: Sequence[int]) -> list[AppliedClock]:
        """Remove pins; the holding session or the default governor decides again.

        The admin's unpin, reset and a pin's expiry: applied to the hardware whatever the arbiter believes.
        """

        def update(slot: _Slot) -> None:
            slot.pin = None

        return self._update_and_apply(indices, update, force=True)

    def retry_degraded(self) -> list[AppliedClock]:
        """Re-apply degraded GPUs whose back-off has passed, and write ledger removals a full disk left
        pending (called by the daemon's reaper)."""
        if not self._dry_run:
            self._ledger.retry_removals()
        now = self._clock()
        due = [i for i, s in self._slots.items() if s.degraded_reason and now >= s.retry_at_s]
        return self._update_and_apply(due, lambda _slot: None) if due else []

    def release_all(self) -> list[AppliedClock]:
        """Forget every pin and session wish and reset every GPU of the node (shutdown path).

        Every GPU, not only those eerld believes it locked: a lock it cannot see must not outlive it.
        """
        for slot in self._slots.values():
            with slot.lock:
                slot.pin = None
                slot.session_id = None
                slot.session_clock_mhz = None
        return self._update_and_apply(list(self._slots), lambda _slot: None, force=True)

    def _update_and_apply(
        self, indices: Sequence[int], update: Callable[[_Slot], None], *, force: bool = False
    ) -> list[AppliedClock]:
        def one(slot: _Slot) -> AppliedClock:
            with slot.lock:
                update(slot)
                return self._apply(slot, force=force)

        return self._map(indices, one)

    def _map(self, indices: Iterable[int], fn: Callable[[_Slot], AppliedClock]) -> list[AppliedClock]:
        slots = [self._slots[i] for i in indices]
        if len(slots) == 1:
            return [self._call(fn, slots[0])]
        try:
            futures = [self._pool.submit(fn, s) for s in slots]
        except RuntimeError:  # the pool is shut down (daemon stopping): one GPU after the other
            return [self._call(fn, s) for s in slots]
        wait_futures(futures, timeout=self._apply_timeout_s)
        results: list[AppliedClock] = []
        for slot, future in zip(slots, futures, strict=True):
            if future.done() and future.exception() is None:
                results.append(future.result())
            else:
                reason = "backend call timed out" if not future.done() else f"{future.exception()!r}"
                results.append(self._failed(slot, reason))
        return results

    def _call(self, fn: Callable[[_Slot], AppliedClock], slot: _Slot) -> AppliedClock:
        """``fn(slot)`` in this thread; as in the pool, a failure is a result naming it, never a raise."""
        try:
            return fn(slot)
        except Exception as e:
            log.exception("clock_apply_error", gpu_index=slot.identity.index)
            return self._failed(slot, f"{e!r}")

    def _failed(self, slot: _Slot, reason: str) -> AppliedClock:
        return AppliedClock(
            slot.identity.index, slot.identity.uuid, 0, None, ClockSource.DEFAULT, self._dry_run, reason
        )

    # -- actuation (slot lock held) -------------------------------------------------------------------

    def _apply(self, slot: _Slot, *, force: bool = False) -> AppliedClock:
        target_sm, target_mem, source = slot.target()
        index, uuid = slot.identity.index, slot.identity.uuid
        if self._dry_run:
            slot.would_lock_mhz = target_sm
            return self._result(slot, target_sm, source, None)
        unchanged = target_sm == slot.applied_sm_mhz and target_mem == slot.applied_mem_mhz
        if unchanged and not slot.degraded_reason and not force:
            return self._result(slot, target_sm, source, None)
        if self._rate_limited(slot, target_sm, source, force=force):
            return self._result(slot, target_sm, source, None)
        read_back: int | None = None
        to_default = target_sm is None and target_mem is None
        try:
            if not to_default:
                # durably listed before any lock: a record that cannot be written means no lock
                self._ledger.add(LedgerEntry(index, uuid, source.value))
            if to_default and (force or slot.degraded_reason):
                self._reset_everything_on(slot)  # fail-safe: whatever the arbiter believes
            else:
                if target_mem != slot.applied_mem_mhz or force:
                    self._actuate_mem(slot, target_mem)
                if target_sm != slot.applied_sm_mhz or slot.degraded_reason or force:
                    read_back = self._actuate_sm(slot, target_sm)
        except (GpuError, OSError, ConfigError) as e:
            self._degrade(slot, error_reason(e))
            return self._result(slot, target_sm, source, None)
        if to_default and slot.session_id is None:
            # A GPU its session still holds stays listed between phases: its next phase's lock then needs
            # no ledger write, and no release waits for one (a crash meanwhile resets it again: harmless).
            self._unlist(slot)
        if slot.degraded_reason:
            log.info("gpu_recovered", gpu_index=index, gpu_uuid=uuid)
        slot.degraded_reason = ""
        slot.backoff_s = RETRY_INITIAL_S
        return self._result(slot, target_sm, source, read_back)

    def _rate_limited(self, slot: _Slot, target_sm: int | None, source: ClockSource, *, force: bool) -> bool:
        """True when a session's lock change on this GPU is over the rate limit (the GPU keeps its clock):
        :meth:`_Slot.rate_rule` says which changes the limit holds back. Pins are checked before they are set
        (:meth:`pins_allowed`).
        """
        now = self._clock()
        rule = slot.rate_rule(target_sm, source, force=force)
        if rule is _RateRule.EXEMPT:
            self._limiter.take(slot.identity.index, now)
            return False
        if rule is _RateRule.SAME or self._limiter.allow(slot.identity.index, now):
            return False
        log.debug(
            "clock_change_rate_limited",
            gpu_index=slot.identity.index,
            gpu_uuid=slot.identity.uuid,
            sm_clock_mhz=target_sm,
            held_sm_clock_mhz=slot.applied_sm_mhz,
        )
        return True

    def would_rate_limit(self, indices: Sequence[int], sm_clock_mhz: int | None) -> list[int]:
        """The GPUs among ``indices`` on which a session's wish for ``sm_clock_mhz`` would be skipped by the
        rate limit now (nothing taken; :meth:`_Slot.rate_rule`): never a pinned, degraded or already-there
        GPU, a change to the default governor, or any in dry-run."""
        if self._dry_run:
            return []
        now = self._clock()
        limited: list[int] = []
        for index in indices:
            slot = self._slots[index]
            with slot.lock:
                source = ClockSource.ADMIN_PIN if slot.pin is not None else ClockSource.SESSION
                rule = slot.rate_rule(sm_clock_mhz, source, force=False)
            if rule is not _RateRule.LIMITED:
                continue
            if not self._limiter.available(index, now):
                limited.append(index)
        return limited

    def over_rate(self, indices: Sequence[int]) -> list[int]:
        """The GPUs among ``indices`` whose clock-change budget is spent now (a pin would be refused)."""
        now = self._clock()
        return [i for i in indices if not self._limiter.available(i, now)]

    def _actuate_sm(self, slot: _Slot, target_sm: int | None) -> int | None:
        index, uuid = slot.identity.index, slot.identity.uuid
        read_back: int | None = None
        if target_sm is None:
            self._reset_sm(slot)
            log.info("clock_reset", gpu_index=index, gpu_uuid=uuid, session_id=slot.log_session_id)
        elif slot.locks_work:
            read_back = self._backend.lock_sm_clock(index, target_sm)
            log.info(
                "clock_lock",
                gpu_index=index,
                gpu_uuid=uuid,
                sm_clock_mhz=target_sm,
                read_back_mhz=read_back,
                session_id=slot.log_session_id,
                pinned=slot.pin is not None,
            )
        else:
            self._backend.set_application_clocks(index, slot.max_mem_clock_mhz, target_sm)
            log.info("application_clock_set", gpu_index=index, gpu_uuid=uuid, sm_clock_mhz=target_sm)
        slot.applied_sm_mhz = target_sm
        return read_back

    def _reset_sm(self, slot: _Slot) -> None:
        """Give the SM clock back to the driver by whichever actuator this GPU uses."""
        if slot.locks_work:
            self._backend.reset_sm_clock(slot.identity.index)
        else:
            self._backend.reset_application_clocks(slot.identity.index)

    def _actuate_mem(self, slot: _Slot, target_mem: int | None) -> None:
        index = slot.identity.index
        if target_mem is None:
            if slot.applied_mem_mhz is not None:
                self._backend.reset_mem_clock(index)
        else:
            self._backend.lock_mem_clock(index, target_mem)
        slot.applied_mem_mhz = target_mem

    def _reset_everything_on(self, slot: _Slot) -> None:
        """:func:`reset_gpu_clocks` on the slot's GPU (GpuError on failure); the arbiter's view follows."""
        index = slot.identity.index
        held = (slot.applied_sm_mhz, slot.applied_mem_mhz) != (None, None) or bool(slot.degraded_reason)
        try:
            reset_gpu_clocks(self._backend, index, locks_work=slot.locks_work)
        finally:
            # whatever failed, nothing eerld asked for holds any more; a retry resets everything again
            slot.applied_sm_mhz = None
            slot.applied_mem_mhz = None
        uuid, session_id = slot.identity.uuid, slot.log_session_id  # info: only a GPU that held something
        (log.info if held else log.debug)(
            "clock_reset", gpu_index=index, gpu_uuid=uuid, session_id=session_id
        )

    def _unlist(self, slot: _Slot) -> None:
        """Remove a reset GPU from the ledger; a failed write keeps it listed (safe) and is retried later."""
        try:
            self._ledger.remove(slot.identity.index)
        except (OSError, ConfigError) as e:
            log.warning(
                "ledger_write_failed",
                gpu_index=slot.identity.index,
                gpu_uuid=slot.identity.uuid,
                reason=error_reason(e),
                action="the GPU stays listed; its removal is retried",
            )

    def _reset_hardware(self, slot: _Slot, *, reason: str) -> bool:
        """Reset every clock setting whatever eerld believes; degrade on failure."""
        index = slot.identity.index
        held = (slot.applied_sm_mhz, slot.applied_mem_mhz) != (None, None) or bool(slot.degraded_reason)
        try:
            reset_gpu_clocks(self._backend, index, locks_work=slot.locks_work)
        except GpuError as e:
            self._degrade(slot, error_reason(e))
            return False
        slot.applied_sm_mhz = None
        slot.applied_mem_mhz = None
        slot.degraded_reason = ""
        (log.info if held else log.debug)(
            "clock_reset", gpu_index=index, gpu_uuid=slot.identity.uuid, reason=reason
        )
        return True

    def _degrade(self, slot: _Slot, reason: str) -> None:
        first = not slot.degraded_reason
        slot.degraded_reason = reason
        slot.retry_at_s = self._clock() + slot.backoff_s
        log.warning(
            "gpu_degraded",
            gpu_index=slot.identity.index,
            gpu_uuid=slot.identity.uuid,
            reason=reason,
            retry_in_s=slot.backoff_s,
            session_id=slot.log_session_id,
            first=first,
        )
        slot.backoff_s = min(RETRY_MAX_S, slot.backoff_s * 2)

    def _result(
        self, slot: _Slot, target_sm: int | None, source: ClockSource, read_back: int | None
    ) -> AppliedClock:
        if read_back is None and not slot.degraded_reason:
            try:
                read_back = self._backend.clocks(slot.identity.index).sm_clock_mhz
            except GpuError as e:
                self._degrade(slot, error_reason(e))
        return AppliedClock(
            index=slot.identity.index,
            uuid=slot.identity.uuid,
            sm_clock_mhz=read_back or 0,
            requested_sm_clock_mhz=target_sm,
            source=source,
            dry_run=self._dry_run,
            degraded_reason=slot.degraded_reason,
        )

    # -- views ---------------------------------------------------------------------------------------

    def view(self, index: int) -> Arbitration:
        """The arbiter's view of one GPU."""
        slot = self._slots[index]
        _sm, _mem, source = slot.target()
        return Arbitration(
            index=index,
            uuid=slot.identity.uuid,
            source=source,
            pin=slot.pin,
            session_id=slot.log_session_id,
            locked_sm_clock_mhz=slot.applied_sm_mhz,
            would_lock_sm_clock_mhz=slot.would_lock_mhz if self._dry_run else None,
            degraded_reason=slot.degraded_reason,
        )
