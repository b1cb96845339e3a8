"""The hub: builds the daemon's components over one GPU backend and sequences the events that span them.

:class:`Daemon` holds one of each component and exposes them; the API layer (:mod:`eerld.api`), the
metrics (:mod:`eerld.metrics`), the pod watch and the tests call the component a request is about:

- :attr:`Daemon.book` (:class:`~eerld.daemon.book.SessionBook`): OpenSession, Attach, Heartbeat,
  CloseSession, claim tickets' use, the sessions a pod watch ends;
- :attr:`Daemon.phases` (:class:`~eerld.daemon.phases.PhasePath`): BeginPhase and EndPhase;
- :attr:`Daemon.admin` (:class:`~eerld.daemon.admin.Admin`): pins, drains, resets, grants, claim tickets;
- :attr:`Daemon.reads` (:class:`~eerld.daemon.status.StatusReader`): Status, ListSessions, ListGrants,
  GetDecisions and the metrics' scrape;
- :attr:`Daemon.reports` (:class:`~eerld.daemon.reports.ReportStore`): the finished sessions' reports
  (Report; the book records one as each session ends);
- :attr:`Daemon.events` (:class:`~eerld.daemon.events.Events`): subscribe to and publish RPC, phase and
  directive events;
- :attr:`Daemon.access` (:class:`~eerld.access.Access`): the worker sockets and who may claim what.

Why components and not one facade: a facade's methods would only forward (fourteen of them did), and every
new RPC would be written twice. What is left here is what spans components — the life cycle: start
(recover the ledger, restore pins), the reaper's tick (leases, grants, pins, degraded GPUs, in that
order) and shutdown (refuse new calls, let the claims in flight land, close every session, reset every
GPU). The components depend downward only (the admin on the session book's narrow side, the book on the
claim gate, everything on the arbiter), never back up into the hub; no lock is held across a call into
another component. Time comes from injectable clocks (monotonic for leases and phases, wall for timestamps
and pin expiry), so tests drive leases and expiry without sleeping.

The daemon is given a backend that is ready to use: wrappers (background energy sampling, observe-only
under ``--dry-run``) are applied by the composition root, :mod:`eerld.app`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import structlog
from eerl.control.base import ControllerFactory
from eerl.job.admission import JobPolicy
from eerl.phases import PhaseKind

from eerld import files
from eerld.access import Access
from eerld.clocks.arbiter import APPLY_TIMEOUT_S, AppliedClock, ClockArbiter
from eerld.clocks.ledger import Ledger
from eerld.clocks.pins import PinStore
from eerld.clocks.ratelimit import DEFAULT_MAX_CHANGES_PER_S, ClockChangeLimiter
from eerld.daemon.admin import Admin
from eerld.daemon.book import DEFAULT_LEASE_TTL_S, DEFAULT_THROUGHPUT_THRESHOLD, Attachment, SessionBook
from eerld.daemon.events import Events
from eerld.daemon.gate import ClaimGate
from eerld.daemon.inventory import Inventory
from eerld.daemon.jobmode import IncarnationBook, JobSessions
from eerld.daemon.lifecycle import LifeCycle
from eerld.daemon.phases import PhasePath
from eerld.daemon.reports import ReportStore
from eerld.daemon.status import StatusReader
from eerld.daemon.timebase import PhaseTimebase
from eerld.gpu.base import GpuBackend
from eerld.sessions import DEFAULT_MAX_LEASE_TTL_S, SessionRegistry

log = structlog.get_logger("eerld.daemon")


class Daemon:
    """The hub of eerld: its components over one GPU backend, and their life cycle."""

    def __init__(
        self,
        backend: GpuBackend,
        state_dir: Path,
        *,
        controller_name: str,
        controller_factory: ControllerFactory,
        fixed_clocks_mhz: Mapping[PhaseKind, int] | None = None,
        dry_run: bool = False,
        default_lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        max_lease_ttl_s: float = DEFAULT_MAX_LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        phase_clock: Callable[[], float] | None = None,
        clock_workers: int = 8,
        apply_timeout_s: float = APPLY_TIMEOUT_S,
        max_clock_changes_per_s: float = DEFAULT_MAX_CHANGES_PER_S,
        tenancy: str = "single",
        socket_path: Path = Path("/run/eerld/eerld.sock"),
        grant_dir: Path | None = None,
        gpu_socket_dir: Path | None = None,
        job_policy: JobPolicy | None = None,
    ) -> None:
        """``backend`` is used as given (under ``dry_run`` the composition root wraps it observe-only);
        ``dry_run`` makes the arbiter skip actuation. ``phase_clock`` times phases (the backend's own
        clock where it has one, so durations and energy agree); leases and pins stay on ``clock`` and
        ``wall_clock``. ``job_policy`` is the admin's envelope for job mode (default: allowed, auto floor).
        No session's lease is longer than ``max_lease_ttl_s``, whatever it asks for."""
        policy = job_policy if job_policy is not None else JobPolicy()
        incarnations = IncarnationBook()
        jobs = JobSessions()
        fixed = dict(fixed_clocks_mhz or {})
        # every phase-clock reading is paired with the wall clock: decisions are shown in UTC
        timebase = PhaseTimebase(phase_clock if phase_clock is not None else clock, wall_clock)
        started_s = clock()
        inventory = Inventory(backend)
        inventory.check_fixed_clocks(fixed)
        files.ensure_private_dir(state_dir, "--state-dir")
        self._clock = clock
        self._inventory = inventory
        self.access = Access(
            inventory.identities,
            state_dir,
            tenancy=tenancy,
            shared_socket=socket_path,
            grant_dir=grant_dir,
            gpu_socket_dir=gpu_socket_dir,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._arbiter = ClockArbiter(
            backend,
            Ledger(state_dir),
            dry_run=dry_run,
            clock=clock,
            max_workers=clock_workers,
            apply_timeout_s=apply_timeout_s,
            change_limiter=ClockChangeLimiter(max_clock_changes_per_s),
        )
        registry = SessionRegistry()
        self._life = LifeCycle()
        self.events = Events()
        self._gate = ClaimGate(inventory, self._life, wall_clock=wall_clock)
        self.reads = StatusReader(
            backend,
            inventory,
            self._arbiter,
            registry,
            self.access,
            jobs=jobs,
            controller_name=controller_name,
            clock=clock,
            started_s=started_s,
            timebase=timebase,
            drains=self._gate,
        )
        self.reports = ReportStore(state_dir)
        self.book = SessionBook(
            registry,
            inventory,
            self._arbiter,
            self.access,
            self._gate,
            life=self._life,
            archive=self.reads,
            reports=self.reports,
            controller_factory=controller_factory,
            fixed_clocks_mhz=fixed,
            job_policy=policy,
            incarnations=incarnations,
            jobs=jobs,
            default_lease_ttl_s=default_lease_ttl_s,
            max_lease_ttl_s=max_lease_ttl_s,
            clock=clock,
            wall_clock=wall_clock,
        )
        self.phases = PhasePath(
            backend,
            self._arbiter,
            registry,
            self._life,
            self.events,
            jobs=jobs,
            incarnations=incarnations,
            job_policy=policy,
            clock=clock,
            phase_clock=timebase.now,
            wall_clock=wall_clock,
        )
        self.admin = Admin(
            inventory,
            self._arbiter,
            PinStore(state_dir),
            self.access,
            self.book,
            gate=self._gate,
            life=self._life,
            clock=clock,
            wall_clock=wall_clock,
        )

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Reset every GPU a previous daemon left locked, then re-apply the persisted admin pins.

        A corrupt ledger names nothing: every GPU is reset and the file set aside (the arbiter). Pins are
        checked as the Pin RPC checks them (:meth:`eerld.daemon.admin.Admin.restore_pins`).
        """
        reset = self._arbiter.recover_from_ledger()
        log.info("daemon_start", gpus=len(self._inventory), ledger_reset=reset, dry_run=self.dry_run)
        self.admin.restore_pins()

    def start_reaper(self, interval_s: float = 0.2) -> None:
        """Run :meth:`tick` in a background thread every ``interval_s``."""
        self._life.start_reaper(self.tick, interval_s)

    def tick(self) -> None:
        """Expire leases, grants and pins, retry degraded GPUs (the reaper calls this; tests call it too)."""
        self.book.expire_leases()
        self.admin.expire()
        self._arbiter.retry_degraded()
        self.admin.flush_pins()

    def shutdown(self) -> list[AppliedClock]:
        """Refuse new calls, close every session and reset every GPU eerld locked (pins stay on disk)."""
        self._life.stop()
        self._gate.settle()  # a claim admitted before the stop has added its session: it is closed below
        self.book.close_all("daemon stopping")
        results = self._arbiter.release_all()
        log.info("daemon_stop", reset_gpus=[r.index for r in results])
        self._arbiter.close()
        return results

    def reset_clocks(self) -> list[AppliedClock]:
        """Reset every GPU and empty the ledger (``eerld --reset-clocks``)."""
        results = self._arbiter.reset_everything()
        self._arbiter.close()
        return results

    @property
    def dry_run(self) -> bool:
        """True when decisions are never applied."""
        return self._arbiter.dry_run

    @property
    def stopping(self) -> bool:
        """True once shutdown began."""
        return self._life.stopping


__all__ = ["DEFAULT_LEASE_TTL_S", "DEFAULT_THROUGHPUT_THRESHOLD", "Attachment", "Daemon"]
