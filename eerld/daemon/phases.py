"""The phase path: BeginPhase and EndPhase of an open session, in the order the events happen.

A node-mode BeginPhase asks the session's controller (:mod:`eerl.control`) for the phase's clock; a
job-mode one takes it from the directive it carries once judged (:func:`~eerld.daemon.jobmode.judge`,
then the GPUs' rate limit: :meth:`PhasePath.rule`), or runs at the fallback. Either way the clock is
applied through the :class:`~eerld.clocks.arbiter.ClockArbiter` (whose ledger records a lock before it is
set) and the energy counters are read to start metering.

EndPhase is a sequence of named steps (:meth:`PhasePath.end_phase`): read the counters and release the
lock, account the phase to the session, feed the controller, tell the async peers' controllers, publish
the record to the phase observers. The lock ends with its phase: the work between phases runs at the
default governor (docs/algorithm.md, "Whole iterations").

Each phase call holds its session's lock; nothing here holds another lock or calls back up.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from eerl.clocks import nearest_supported_mhz
from eerl.control.base import Decision, PhaseObservation
from eerl.directives import DirectiveVerdict
from eerl.job.admission import JobPolicy, ReceivedDirective, Ruling, judge, rate_limited, to_default
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload

from eerld.clocks.arbiter import AppliedClock, ClockArbiter, ClockSource
from eerld.clocks.pins import Pin
from eerld.daemon.events import Events
from eerld.daemon.jobmode import IncarnationBook, JobDecision, JobSessions, JobState
from eerld.daemon.lifecycle import LifeCycle
from eerld.daemon.views import BeganPhase, DirectiveRecord, EndedPhase, PhaseRecord
from eerld.energy import CounterReading, PhaseEnergy, phase_energy, read_counters
from eerld.errors import NotFound
from eerld.gpu.base import GpuBackend
from eerld.sessions import ActivePhase, HeldSession, SessionRegistry, short_id

log = structlog.get_logger("eerld.daemon")


@dataclass(frozen=True, slots=True)
class _Metered:
    """An ended phase, measured: what its lock was and what it cost."""

    active: ActivePhase
    energy: PhaseEnergy
    observation: PhaseObservation


class PhasePath:
    """BeginPhase and EndPhase over the open sessions, their controllers and the arbiter."""

    def __init__(
        self,
        backend: GpuBackend,
        arbiter: ClockArbiter,
        sessions: SessionRegistry,
        life: LifeCycle,
        events: Events,
        *,
        jobs: JobSessions,
        incarnations: IncarnationBook,
        job_policy: JobPolicy,
        clock: Callable[[], float],
        phase_clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        """``phase_clock`` times phases (the backend's own clock where it has one, so durations and energy
        agree); leases stay on ``clock``; ``wall_clock`` says since when a session held its clock."""
        self._backend = backend
        self._arbiter = arbiter
        self._sessions = sessions
        self._life = life
        self._events = events
        self._jobs = jobs
        self._incarnations = incarnations
        self._job_policy = job_policy
        self._clock = clock
        self._phase_clock = phase_clock
        self._wall = wall_clock

    # -- BeginPhase ---------------------------------------------------------------------------------

    def begin_phase(
        self,
        session_id: str,
        kind: PhaseKind,
        iteration: int,
        hints: Workload | None,
        directive: ReceivedDirective | None = None,
    ) -> BeganPhase:
        """Decide the phase's clock, apply it to the session's GPUs, read it back, start metering.

        A job-mode session's clock is its ``directive``'s, once checked (:mod:`eerld.daemon.jobmode`); a
        refused or missing one runs the phase at the fallback. Any other session ignores a directive
        (verdict NOT_JOB_MODE) and its controller decides.
        """
        self._life.check_running()
        session = self._sessions.get(session_id)
        job = self._jobs.get(session_id)
        if job is not None:
            return self._begin_job_phase(session, job, kind, iteration, directive)
        with session.lock:
            abandoned = _check_begin(session, kind, iteration)
            now_s = self._clock()
            pins = self._pins_of(session)
            if pins:  # the pin decides its GPUs, the default governor the others; the controller waits
                decision = _pinned_decision(kind, iteration, pins, self._phase_clock())
                session.pin_decisions.append(decision)
            else:
                decision = self._decide(session, kind, iteration, hints, self._phase_clock())
            clocks = self._arbiter.set_session(session.gpu_indices, session.session_id, decision.sm_clock_mhz)
            begin = read_counters(self._backend, session.gpu_indices, self._phase_clock())
            held = _held_clock(clocks, decision.sm_clock_mhz)
            session.active = ActivePhase(
                kind, iteration, held, begin, gap_before_s=_gap(session, begin), pinned=bool(pins)
            )
            session.last_iteration = iteration
            session.last_decision[kind] = decision
            session.renew(now_s)
        if directive is not None:
            log.info(
                "job_directive_ignored",
                session_id=short_id(session.session_id),
                job_id=session.spec.job_id,
                kind=kind.value,
                iteration=iteration,
                verdict=DirectiveVerdict.NOT_JOB_MODE.value,
            )
        return BeganPhase(tuple(clocks), decision.state, decision.sm_clock_mhz, abandoned is not None)

    def _pins_of(self, session: HeldSession) -> list[tuple[int, Pin]]:
        """The session's GPUs an admin pin holds now; a change since its last begin is logged once."""
        pins = [(i, pin) for i in session.gpu_indices if (pin := self._arbiter.view(i).pin) is not None]
        indices = tuple(i for i, _ in pins)
        if indices != session.pinned_gpus:
            if indices:
                log.warning(
                    "session_pinned",
                    session_id=short_id(session.session_id),
                    job_id=session.spec.job_id,
                    gpu_indices=list(indices),
                    detail="an admin pin holds these GPUs: the session's other GPUs run the default governor "
                    "and its controller waits until the pin is removed (eerlctl unpin)",
                )
            else:
                log.info(
                    "session_unpinned", session_id=short_id(session.session_id), job_id=session.spec.job_id
                )
            session.pinned_gpus = indices
        return pins

    def _decide(
        self, session: HeldSession, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float
    ) -> Decision:
        try:
            decision = session.controller.decide(kind, iteration, hints, now_s)
        except Exception:
            log.exception("controller_error", session_id=short_id(session.session_id), kind=kind.value)
            return Decision(kind, iteration, None, ControllerState.OFF, "controller error: default", now_s)
        supported = session.supported_sm_clocks_mhz
        if decision.sm_clock_mhz is not None and supported and decision.sm_clock_mhz not in supported:
            log.warning(
                "controller_unsupported_clock",
                session_id=short_id(session.session_id),
                sm_clock_mhz=decision.sm_clock_mhz,
            )
            snapped = nearest_supported_mhz(supported, decision.sm_clock_mhz)
            decision = Decision(kind, iteration, snapped, decision.state, decision.reason, decision.time_s)
        return decision

    def _begin_job_phase(
        self,
        session: HeldSession,
        job: JobState,
        kind: PhaseKind,
        iteration: int,
        directive: ReceivedDirective | None,
    ) -> BeganPhase:
        with session.lock:
            abandoned = _check_begin(session, kind, iteration)
            now_s = self._clock()
            ruling = self.rule(session, job, kind=kind, iteration=iteration, directive=directive, now_s=now_s)
            clocks = self._arbiter.set_session(session.gpu_indices, session.session_id, ruling.sm_clock_mhz)
            job.record(ruling, kind, now_s)
            if ruling.accepted and directive is not None:
                self._incarnations.accept(job.key, directive.incarnation)
            begin = read_counters(self._backend, session.gpu_indices, self._phase_clock())
            held = _held_clock(clocks, ruling.sm_clock_mhz)
            session.active = ActivePhase(
                kind, iteration, held, begin, ruling.verdict, ruling.applied_epoch, _gap(session, begin)
            )
            session.last_iteration = iteration
            decision = Decision(
                kind, iteration, ruling.sm_clock_mhz, ruling.state, ruling.reason(), begin.time_s
            )
            session.last_decision[kind] = decision
            job.remember(JobDecision(decision, directive, ruling.verdict))
            session.renew(now_s)
        log.info(
            "job_directive",
            session_id=short_id(session.session_id),
            job_id=session.spec.job_id,
            node_rank=job.spec.node_rank,
            kind=kind.value,
            iteration=iteration,
            verdict=ruling.verdict.value,
            detail=ruling.detail,
            directive=directive.describe() if directive is not None else None,
            sm_clock_mhz=ruling.sm_clock_mhz,
            held_sm_clock_mhz=held,
            applied_epoch=ruling.applied_epoch,
        )
        if self._events.wants_directives:  # metrics on: tell them (nothing to build otherwise)
            self._events.directive_judged(
                DirectiveRecord(
                    session.spec.job_id,
                    job.spec.node_rank,
                    kind,
                    iteration,
                    ruling.verdict,
                    ruling.sm_clock_mhz,
                )
            )
        return BeganPhase(
            tuple(clocks),
            ruling.state,
            ruling.sm_clock_mhz,
            abandoned is not None,
            verdict=ruling.verdict,
            verdict_detail=ruling.detail,
            applied_epoch=ruling.applied_epoch,
        )

    def rule(
        self,
        session: HeldSession,
        job: JobState,
        *,
        kind: PhaseKind,
        iteration: int,
        directive: ReceivedDirective | None,
        now_s: float,
    ) -> Ruling:
        """The verdict on the directive and the clock to apply: checks 1-8, then the rate limit (check 9).

        A fallback the rate limit would refuse as well goes to the default governor (a reset is never held
        back), so that the GPUs never stay at an earlier trial clock.
        """
        ruling = judge(
            directive,
            job,
            self._job_policy,
            newest_incarnation=self._incarnations.newest(job.key),
            kind=kind,
            iteration=iteration,
            supported_mhz=session.supported_sm_clocks_mhz,
            now_s=now_s,
        )
        indices = session.gpu_indices
        if ruling.sm_clock_mhz is not None and self._arbiter.would_rate_limit(indices, ruling.sm_clock_mhz):
            if ruling.accepted:
                ruling = rate_limited(job, ruling, kind)
            if ruling.sm_clock_mhz is not None and self._arbiter.would_rate_limit(
                indices, ruling.sm_clock_mhz
            ):
                ruling = to_default(ruling)
        return ruling

    # -- EndPhase -----------------------------------------------------------------------------------

    def end_phase(self, session_id: str, kind: PhaseKind, iteration: int, workload: Workload) -> EndedPhase:
        """Meter the running phase, release its lock, attribute it to (session, kind, iteration) and tell
        the controller.

        The lock ends with its phase: the work a trainer does between phases (log-probabilities, rewards,
        weight sync) runs at the default governor, as it would without eerl, and its time reaches the
        controller as the next phase's gap (see docs/algorithm.md, "Whole iterations").
        """
        self._life.check_running()
        session = self._sessions.get(session_id)
        with session.lock:
            if session.closed:
                raise NotFound("session_id: no open session with this id")
            active = session.check_end(kind, iteration)
            metered = self._meter_and_release(session, active, workload)
            self._account(session, metered, workload)
            state = self._feed_controller(session, metered)
        _warn_incomplete(session_id, metered.energy)
        self._tell_peers(session, metered)
        if self._events.wants_phases:  # metrics on: tell them (nothing to build otherwise)
            self._events.phase_ended(_phase_record(session, metered, workload, state))
        energy = metered.energy
        return EndedPhase(
            energy.duration_s,
            energy.energy_mj,
            energy.mean_power_w,
            state,
            sm_clock_mhz=active.sm_clock_mhz,
            applied_epoch=active.applied_epoch,
            verdict=active.verdict,
            gpus=len(session.gpu_indices),
        )

    def _meter_and_release(self, session: HeldSession, active: ActivePhase, workload: Workload) -> _Metered:
        """Read the counters, end the phase's lock, and measure the phase against its begin reading."""
        end = read_counters(self._backend, session.gpu_indices, self._phase_clock())
        self._arbiter.set_session(session.gpu_indices, session.session_id, None)
        session.last_end_time_s = end.time_s
        energy = phase_energy(active.begin, end, session.gpu_indices)
        observation = PhaseObservation(
            kind=active.kind,
            iteration=active.iteration,
            workload=workload,
            duration_s=energy.duration_s,
            energy_j=energy.energy_mj / 1000.0,
            sm_clock_mhz=active.sm_clock_mhz,
            gpus=len(session.gpu_indices),
            end_time_s=end.time_s,
            gap_before_s=active.gap_before_s,
        )
        return _Metered(active, energy, observation)

    def _account(self, session: HeldSession, metered: _Metered, workload: Workload) -> None:
        """The phase is over: the session's totals, its last ended iteration, its lease renewed."""
        kind, energy = metered.active.kind, metered.energy
        session.active = None
        session.last_ended[kind] = metered.active.iteration
        session.held_since_unix_s = self._wall()
        session.totals[kind].add(energy.energy_mj, workload.valid_tokens, workload.tokens, energy.duration_s)
        if metered.active.pinned:
            session.totals[kind].pinned_phases += 1
        session.renew(self._clock())

    def _feed_controller(self, session: HeldSession, metered: _Metered) -> ControllerState:
        """Node mode: the session's controller observes the phase; its state of the kind. Job mode: the
        job-level controller observes what EndPhase returns; the state of the last ruling."""
        kind = metered.active.kind
        if metered.active.pinned:  # a clock the controller did not choose: nothing to learn from
            return ControllerState.PINNED
        job = self._jobs.get(session.session_id)
        if job is None:
            _observe(session, metered.observation)
            return _state_of(session, kind)
        ruling = job.last.get(kind)
        return ruling.state if ruling is not None else ControllerState.OFF

    def _tell_peers(self, session: HeldSession, metered: _Metered) -> None:
        """An async session's phase is observed by the controllers of its peers too (each under its lock)."""
        if session.spec.mode is not ExecutionMode.ASYNC or metered.active.pinned:
            return
        for peer in self._sessions.peers(session):
            with peer.lock:
                if not peer.closed:
                    _observe(peer, metered.observation)


def _observe(session: HeldSession, observation: PhaseObservation) -> None:
    try:
        session.controller.observe(observation, observation.end_time_s)
    except Exception:
        log.exception("controller_error", session_id=short_id(session.session_id))


def _state_of(session: HeldSession, kind: PhaseKind) -> ControllerState:
    try:
        state = session.controller.state_of(kind)
    except Exception:
        log.exception("controller_error", session_id=short_id(session.session_id))
        state = None
    if state is not None:
        return state
    last = session.last_decision.get(kind)
    return last.state if last else ControllerState.OFF


def _warn_incomplete(session_id: str, energy: PhaseEnergy) -> None:
    if energy.counter_reset or not energy.complete:
        log.warning(
            "energy_incomplete",
            session_id=short_id(session_id),
            counter_reset=energy.counter_reset,
            complete=energy.complete,
        )


def _phase_record(
    session: HeldSession, metered: _Metered, workload: Workload, state: ControllerState
) -> PhaseRecord:
    active, energy = metered.active, metered.energy
    return PhaseRecord(
        session_id=session.session_id,
        job_id=session.spec.job_id,
        rank=session.spec.rank,
        kind=active.kind,
        iteration=active.iteration,
        duration_s=energy.duration_s,
        energy_mj=energy.energy_mj,
        tokens=workload.tokens,
        valid_tokens=workload.valid_tokens,
        sm_clock_mhz=active.sm_clock_mhz,
        gpu_indices=session.gpu_indices,
        state=state,
    )


def _check_begin(session: HeldSession, kind: PhaseKind, iteration: int) -> ActivePhase | None:
    """Under the session's lock: NotFound for a closed session, the order checks of a BeginPhase; the phase
    it abandons (one that began and never ended), logged, else None."""
    if session.closed:
        raise NotFound("session_id: no open session with this id")
    session.check_begin(kind, iteration)
    abandoned = session.active
    if abandoned is not None:
        log.warning(
            "phase_abandoned",
            session_id=short_id(session.session_id),
            kind=abandoned.kind.value,
            iteration=abandoned.iteration,
            reason="a new phase began before it ended (its EndPhase was lost or refused)",
        )
    return abandoned


def _gap(session: HeldSession, begin: CounterReading) -> float:
    """Time since the session's previous EndPhase on the backend clock (0 for its first phase)."""
    last = session.last_end_time_s
    return max(0.0, begin.time_s - last) if last is not None else 0.0


def _pinned_decision(
    kind: PhaseKind, iteration: int, pins: Sequence[tuple[int, Pin]], now_s: float
) -> Decision:
    """eerld's decision for a phase an admin pin holds: the session asks for no lock (the pin's GPUs run at
    the pin, the others at the default governor), and the reason names the pin."""
    named = ", ".join(f'GPU {i} ({pin.sm_clock_mhz} MHz, "{pin.reason}")' for i, pin in pins)
    return Decision(
        kind,
        iteration,
        None,
        ControllerState.PINNED,
        f"admin pin on {named}: the other GPUs run the default governor and the controller waits until "
        "eerlctl unpin",
        now_s,
    )


def _held_clock(clocks: Sequence[AppliedClock], wanted: int | None) -> int | None:
    """The lock that holds during the phase: the pin's when pinned, none in dry-run, else the decision's."""
    if any(c.dry_run for c in clocks):
        return None
    for c in clocks:
        if c.source is ClockSource.ADMIN_PIN and c.requested_sm_clock_mhz is not None:
            return c.requested_sm_clock_mhz
    return wanted


__all__ = ["PhasePath"]
