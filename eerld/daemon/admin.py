"""What the admin socket changes: pins, drains, resets and grants (their sockets, sessions and claim tickets).

A pin is written to the pin file before the arbiter applies it and survives restarts (:meth:`Admin.
restore_pins` re-checks each one at start, as the Pin RPC checks a new one); a GPU already pinned takes a
new pin only with ``replace`` (the reply names the pins replaced), and every pin records who set it. A
drain refuses new claims of its GPUs until undrained or expired (:mod:`eerld.daemon.drains`); a reset
closes the sessions holding the GPUs and removes their pins unless told to keep them (the Slurm prolog and
epilog keep them); a removed or expired grant closes the sessions whose authority came from it and
returns its GPUs to default.

Every change first checks that the daemon runs (:meth:`~eerld.daemon.lifecycle.LifeCycle.check_running`).
Closing a session and telling its attached client are the session book's: this module depends on its
narrow side (:class:`~eerld.daemon.book.Holders`) and calls nothing back up. A drain is recorded through the
claim gate (:class:`~eerld.daemon.gate.ClaimGate`), which returns once no claim of its GPUs is in flight,
so the eviction that follows sees every session that got in before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import structlog
from eerl.clocks import nearest_supported_text

from eerld.access import Access
from eerld.clocks.arbiter import AppliedClock, ClockArbiter
from eerld.clocks.pins import Pin, PinStore, pin_problem
from eerld.daemon.book import Holders
from eerld.daemon.drains import Drain, utc_text
from eerld.daemon.gate import ClaimGate
from eerld.daemon.inventory import Inventory
from eerld.daemon.lifecycle import LifeCycle
from eerld.daemon.status import grant_view
from eerld.daemon.views import (
    DrainOutcome,
    GpuPinView,
    GrantOutcome,
    PinOutcome,
    ResetOutcome,
    RevokeOutcome,
    TicketView,
    UndrainOutcome,
    UnpinOutcome,
)
from eerld.errors import Conflict, Exhausted, ValidationError
from eerld.grants import Grant, GrantSpec
from eerld.sessions import GpuSelector

log = structlog.get_logger("eerld.daemon")


class Admin:
    """Pins, drains, resets and grants over the GPUs and the sessions holding them."""

    def __init__(
        self,
        inventory: Inventory,
        arbiter: ClockArbiter,
        pins: PinStore,
        access: Access,
        sessions: Holders,
        *,
        gate: ClaimGate,
        life: LifeCycle,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._inventory = inventory
        self._arbiter = arbiter
        self._pins = pins
        self._access = access
        self._sessions = sessions
        self._gate = gate
        self._life = life
        self._clock = clock
        self._wall = wall_clock

    # -- pins ---------------------------------------------------------------------------------------

    def restore_pins(self) -> None:
        """Re-apply the persisted pins that still hold (at start, after the ledger's GPUs were reset).

        A pin read from disk is checked as the Pin RPC checks one: a pin for a GPU not on this node, or of
        a clock its GPU does not support, is dropped with one ``pin_dropped`` warning (never applied,
        degraded and retried forever); wrong types were dropped when the file was read
        (:mod:`eerld.clocks.pins`); an expired pin is dropped silently.
        """
        now_unix = self._wall()
        pins: list[Pin] = []
        indices: list[int] = []
        dropped: list[str] = []
        for uuid, pin in self._pins.all().items():
            index = self._inventory.index_of(uuid)
            if pin.expired(now_unix):
                dropped.append(uuid)
                continue
            if index is None:
                self._pins.warn_dropped(uuid, "no GPU with this UUID on this node")
                dropped.append(uuid)
                continue
            mems = self._inventory.supported_mem_clocks_mhz(index) if pin.mem_clock_mhz else ()
            problem = pin_problem(pin, self._inventory.supported_sm_clocks_mhz(index), mems)
            if problem:
                self._pins.warn_dropped(uuid, f"GPU {index}: {problem}")
                dropped.append(uuid)
                continue
            pins.append(pin)
            indices.append(index)
        self._pins.remove_many(dropped)
        self._pins.flush()
        if pins:
            self._arbiter.set_pins(pins, indices)
            log.info("pins_restored", gpu_indices=indices)

    def expire(self) -> None:
        """Revoke the grants whose time is up, then remove the pins whose time is up."""
        expired_grants = self._access.expired()
        if expired_grants:
            self.close_granted(expired_grants, reason="grant expired")
        now_unix = self._wall()
        expired = [p for p in self._pins.all().values() if p.expired(now_unix)]
        if expired:
            known = [self._inventory.index_of(p.uuid) for p in expired]
            indices = [i for i in known if i is not None]
            self._pins.remove_many([p.uuid for p in expired])
            self._arbiter.clear_pins(indices)
            log.info("pins_expired", gpu_indices=indices)
        drains = self._gate.expire()
        if drains:
            ended = [i for d in drains if (i := self._inventory.index_of(d.uuid)) is not None]
            log.info("drains_expired", gpu_indices=ended)

    def flush_pins(self) -> None:
        """Retry writing the pin file where an earlier write failed."""
        self._pins.flush()

    def pin(
        self,
        selectors: Sequence[GpuSelector] | None,
        sm_clock_mhz: int,
        mem_clock_mhz: int,
        duration_s: float,
        reason: str,
        *,
        replace: bool = False,
        set_by: str = "",
    ) -> PinOutcome:
        """Pin GPUs (None: all) to a supported clock, durably, until unpinned or expired.

        A GPU that already has a pin is a Conflict naming that pin unless ``replace``; the outcome lists
        the pins replaced. ``set_by`` says who asked (recorded with the pin).
        """
        self._life.check_running()
        indices = self._inventory.select(selectors)
        now_unix = self._wall()
        existing = [
            GpuPinView(i, pin)
            for i in indices
            if (pin := self._pins.get(self._inventory.uuid(i))) is not None and not pin.expired(now_unix)
        ]
        if existing and not replace:
            first = existing[0]
            more = f" (and {len(existing) - 1} more GPU(s))" if len(existing) > 1 else ""
            raise Conflict(
                f"GPU {first.index} is already pinned: {describe_pin(first.pin)}{more}; "
                "replace it explicitly (eerlctl pin --replace) or unpin it first"
            )
        for index in indices:
            supported = self._inventory.supported_sm_clocks_mhz(index)
            if supported and sm_clock_mhz not in supported:
                raise ValidationError(
                    "sm_clock_mhz",
                    f"{sm_clock_mhz} MHz is not supported by GPU {index}; "
                    + nearest_supported_text(supported, sm_clock_mhz),
                )
            if mem_clock_mhz:
                mems = self._inventory.supported_mem_clocks_mhz(index)
                if mems and mem_clock_mhz not in mems:
                    raise ValidationError(
                        "mem_clock_mhz",
                        f"{mem_clock_mhz} MHz is not supported by GPU {index}; "
                        f"supported: {', '.join(str(c) for c in mems)} MHz",
                    )
        spent = self._arbiter.over_rate(indices)
        if spent and not self._arbiter.dry_run:
            raise Exhausted(
                f"GPU {spent[0]} changed clocks more often than its limit allows in the last seconds; "
                "retry in a second (--max-clock-changes-per-s)"
            )
        pins = [
            Pin(
                uuid=self._inventory.uuid(i),
                sm_clock_mhz=sm_clock_mhz,
                mem_clock_mhz=mem_clock_mhz,
                reason=reason,
                created_at_unix_s=now_unix,
                expires_at_unix_s=now_unix + duration_s if duration_s > 0 else 0.0,
                set_by=set_by,
            )
            for i in indices
        ]
        self._pins.put_many(pins)
        results = self._arbiter.set_pins(pins, indices)
        log.info(
            "pin",
            gpu_indices=list(indices),
            sm_clock_mhz=sm_clock_mhz,
            reason=reason,
            duration_s=duration_s,
            set_by=set_by,
            replaced=[{"gpu_index": r.index, **_pin_log(r.pin)} for r in existing],
        )
        self._sessions.notify(indices, f"admin pin at {sm_clock_mhz} MHz on GPU(s) {_fmt(indices)}: {reason}")
        return PinOutcome(tuple(results), tuple(existing))

    def unpin(self, selectors: Sequence[GpuSelector] | None) -> UnpinOutcome:
        """Remove pins; the holding session or the default governor decides again.

        Only the GPUs that had a pin change (their clocks are read back after the change); the others are
        named in ``not_pinned``.
        """
        self._life.check_running()
        indices = self._inventory.select(selectors)
        removed = {
            self._inventory.index_of(p.uuid): p
            for p in self._pins.remove_many([self._inventory.uuid(i) for i in indices])
        }
        # a pin the arbiter holds but the file lost (a failed write) is removed all the same
        pinned = [i for i in indices if i in removed or self._arbiter.view(i).pin is not None]
        results = self._arbiter.clear_pins(pinned) if pinned else []
        not_pinned = tuple(i for i in indices if i not in pinned)
        log.info("unpin", gpu_indices=pinned, not_pinned=list(not_pinned))
        if pinned:
            self._sessions.notify(pinned, f"admin pin removed on GPU(s) {_fmt(pinned)}")
        views = tuple(GpuPinView(i, p) for i, p in removed.items() if i is not None)
        return UnpinOutcome(tuple(results), views, not_pinned)

    def reset(
        self, selectors: Sequence[GpuSelector] | None, reason: str, *, keep_pins: bool = False
    ) -> ResetOutcome:
        """Close the sessions holding the GPUs and return them to default clocks; remove their pins too
        unless ``keep_pins`` (then a pinned GPU goes back to its pin's clock)."""
        self._life.check_running()
        indices = self._inventory.select(selectors)
        closed = self._close_holders(
            indices, f"session closed by admin reset: {reason}", f"admin reset: {reason}"
        )
        if keep_pins:
            # the sessions are gone: each GPU to its pin, else the default governor (a full reset first)
            results = self._release_free(indices)
        else:
            self._pins.remove_many([self._inventory.uuid(i) for i in indices])
            results = self._arbiter.clear_pins(indices)
        log.info(
            "admin_reset",
            gpu_indices=list(indices),
            reason=reason,
            closed_sessions=len(closed),
            keep_pins=keep_pins,
        )
        return ResetOutcome(tuple(results), tuple(closed))

    # -- drains -------------------------------------------------------------------------------------

    def drain(
        self,
        selectors: Sequence[GpuSelector] | None,
        duration_s: float,
        reason: str,
        *,
        keep_sessions: bool = False,
        set_by: str = "",
    ) -> DrainOutcome:
        """No new claims of the GPUs until undrained or ``duration_s`` (0: until undrained) has passed;
        the sessions holding them are closed unless ``keep_sessions``; pins stay."""
        self._life.check_running()
        indices = self._inventory.select(selectors)
        now_unix = self._wall()
        drains = [
            (
                i,
                Drain(
                    uuid=self._inventory.uuid(i),
                    reason=reason,
                    created_at_unix_s=now_unix,
                    expires_at_unix_s=now_unix + duration_s if duration_s > 0 else 0.0,
                    set_by=set_by,
                ),
            )
            for i in indices
        ]
        self._gate.drain(drains)  # a claim in flight either added its session already or sees the drain
        closed: list[str] = []
        if not keep_sessions:
            notice = f"session closed: GPUs drained by an admin: {reason}"
            closed = self._close_holders(indices, notice, f"admin drain: {reason}")
        clocks = self._release_free(indices)
        log.info(
            "drain",
            gpu_indices=list(indices),
            reason=reason,
            closed_sessions=len(closed),
            keep_sessions=keep_sessions,
        )
        return DrainOutcome(tuple(indices), tuple(clocks), tuple(closed))

    def undrain(self, selectors: Sequence[GpuSelector] | None) -> UndrainOutcome:
        """End the drains of the GPUs: they may be claimed again."""
        self._life.check_running()
        indices = self._inventory.select(selectors)
        removed = {d.uuid for d in self._gate.undrain(indices)}
        undrained = tuple(i for i in indices if self._inventory.uuid(i) in removed)
        log.info("undrain", gpu_indices=list(undrained))
        return UndrainOutcome(undrained, tuple(i for i in indices if i not in undrained))

    # -- grants -------------------------------------------------------------------------------------

    def open_grants(self) -> None:
        """Open the per-GPU sockets and the persisted grants (after the daemon started, once serving)."""
        self._access.restore()

    def grant(self, spec: GrantSpec) -> GrantOutcome:
        """Create a scoped worker socket for the spec's GPUs; with replace, revoke the grants in its way
        (the outcome names them; their sessions are closed)."""
        self._life.check_running()
        indices = self._inventory.resolve(spec.gpus)
        grant, replaced = self._access.create(spec, indices)
        if replaced:
            self.close_granted(replaced, reason=f"grant replaced by {grant.name}")
        log.info(
            "grant",
            grant=grant.name,
            gpu_indices=list(indices),
            uid=grant.uid,
            gid=grant.gid,
            job_id=grant.job_id,
            expires_at_unix_s=grant.expires_at_unix_s,
            replaced=[g.name for g in replaced],
            reason=grant.reason,
        )
        view = grant_view(grant, self._inventory, self._access, self._sessions)
        return GrantOutcome(view, tuple(g.name for g in replaced))

    def revoke(self, name: str | None, job_id: str | None, reason: str) -> RevokeOutcome:
        """Remove grants by name or job: their sockets close, their sessions end, their GPUs reset."""
        self._life.check_running()
        removed = self._access.remove(name, job_id)
        closed, clocks = self.close_granted(removed, reason=f"grant revoked: {reason}")
        log.info("revoke", grants=[g.name for g in removed], reason=reason, closed_sessions=len(closed))
        return RevokeOutcome(tuple(g.name for g in removed), tuple(clocks), tuple(closed))

    def close_granted(self, grants: Sequence[Grant], *, reason: str) -> tuple[list[str], list[AppliedClock]]:
        """Close every session whose authority came from these grants, and return their GPUs to default; the
        grants' job incarnations are forgotten (the next grant of a name is another tenant's)."""
        sessions = self._sessions.of_grants({g.name for g in grants})
        self._sessions.forget_tenants({g.name for g in grants})
        for session in sessions:
            self._sessions.notify(session.gpu_indices, f"session closed: {reason}")
            self._sessions.close(session, reason)
        clocks = self._release_free(sorted({i for g in grants for i in self._access.indices(g)}))
        return [s.session_id for s in sessions], clocks

    def _close_holders(self, indices: Sequence[int], notice: str, reason: str) -> list[str]:
        """Tell and close each session holding one of the GPUs (once per session); their ids."""
        closed: list[str] = []
        for index in indices:
            holder = self._sessions.holder(index)
            if holder is not None and holder.session_id not in closed:
                self._sessions.notify(holder.gpu_indices, notice)
                self._sessions.close(holder, reason)
                closed.append(holder.session_id)
        return closed

    def _release_free(self, indices: Sequence[int]) -> list[AppliedClock]:
        """Return the GPUs no session holds to their pin, else the default governor."""
        free = [i for i in indices if self._sessions.holder(i) is None]
        return self._arbiter.set_session(free, None, None) if free else []

    def issue_claim_ticket(self, grant: str) -> TicketView:
        """A one-time ticket for the GPUs of ``grant``'s socket, to show on another socket of the job."""
        self._life.check_running()
        ticket = self._access.issue_ticket(grant)
        gpus = tuple(self._inventory.info(i) for i in self._access.indices(ticket.grant))
        return TicketView(ticket.ticket, gpus, max(0.0, ticket.expires_s - self._clock()))


def _fmt(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


def describe_pin(pin: Pin) -> str:
    """``1200 MHz "maint", set 2026-12-01T14:08:39Z by …, expires 2026-12-01T14:18:39Z``."""
    parts = [f"{pin.sm_clock_mhz} MHz"]
    if pin.mem_clock_mhz:
        parts[0] += f" (memory {pin.mem_clock_mhz} MHz)"
    parts[0] += f' "{pin.reason}"' if pin.reason else " (no reason given)"
    if pin.created_at_unix_s:
        parts.append(f"set {utc_text(pin.created_at_unix_s)}" + (f" by {pin.set_by}" if pin.set_by else ""))
    parts.append(f"expires {utc_text(pin.expires_at_unix_s)}" if pin.expires_at_unix_s else "never expires")
    return ", ".join(parts)


def _pin_log(pin: Pin) -> dict[str, object]:
    return {
        "sm_clock_mhz": pin.sm_clock_mhz,
        "reason": pin.reason,
        "set_by": pin.set_by,
        "expires_at_unix_s": pin.expires_at_unix_s,
    }


__all__ = ["Admin", "describe_pin"]
