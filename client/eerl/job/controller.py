"""The job-level controller: one EE-RL controller for a whole multi-node job (docs/multinode.md).

In synchronous RL every node runs the same phase and the slowest node gates the iteration, so one decision
per job is right and one per node is not. :class:`JobController` wraps the very same pure controller object
a daemon runs for one node (by default the EE-RL controller, tuned for a job: a coarse trial past the energy
minimum is repeated before the descent stops, :data:`eerl.control.eerl.JOB_CONFIG`) and feeds it job-level
observations:

* **plan** — the inner controller's decision for the phase becomes a :class:`~eerl.directives.Directive`
  for every node: its clock, why (purpose: TRIAL while exploring or re-tuning at a non-default clock,
  COMMITTED for a committed clock, CONTROL for the default governor) and a plan epoch that grows by one
  whenever the planned clock of a kind changes (every directive carries the current epoch, so epochs never
  go back);
* **observe** — the nodes' :class:`NodeReport`\\ s count only when every node reported, all ACCEPTED the
  directive (its epoch and its clock) and no node's session restarted since its previous report; otherwise
  the phase is dropped with a reason. A counted phase's duration is the **mean of the faster half** of the
  nodes' durations, less any far behind the fastest (:func:`typical_duration`: a straggler only slows, so
  stragglers are noise, not the effect of the clock), its energy the nodes' sum with any straggler held
  at the straggler limit (:class:`StragglerEnergy`: its energy is no more the clock's than its time), its
  GPUs the sum, its tokens the driver's workload;
* **end_iteration** — the iteration guard. The typical node keeps the controller's estimates calm, but the
  job's wall time is its slowest node's, and the inner plan can be off: the guard compares each committed
  iteration's measured wall time with what the default governor would have needed (per-kind default
  predictors on the typical phase time, each scaled by this iteration's own slowest-to-typical ratio of that
  phase: the same stragglers would have gated the default). When the ratio over a window of iterations
  falls under the threshold it backs off: committed clocks are lifted a step (a fraction of the top clock),
  up to a bound; when it is above the threshold by a margin it trims them a step, down to a bound.

A **pool** controller (disaggregated placement, :mod:`eerl.job.pools`) runs one kind in async mode
(``ControllerSettings(kinds=(kind,), mode=ExecutionMode.ASYNC)``); :meth:`JobController.observe_peer` feeds
it the peer pool's job-level phase times, which its inner controller takes as async slack (a pool that waits
for the other may slow down), and its iteration guard then judges the job's iteration as the slower pool's
time: measured ``max(own slowest node, peer)`` against predicted ``max(own default, peer)``.

Pure like :mod:`eerl.control`: no I/O and no clock reads; time comes in as ``now_s``.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from eerl.control.base import Controller, ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.predictor import BaselinePredictor
from eerl.control.registry import DEFAULT_CONTROLLER, controller_factory
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.errors import ValidationError
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload

__all__ = [
    "GuardConfig",
    "JobController",
    "JobObservation",
    "NodeReport",
    "common_clocks",
    "directive_purpose",
    "make_job_controller",
]


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one node's agent returns after EndPhase."""

    node_rank: int
    session_epoch: int
    """Agent-side counter: +1 every time the agent (re)opened its daemon session."""
    iteration: int
    kind: PhaseKind
    applied_epoch: int
    """EndPhaseResponse.applied_epoch: the plan epoch of the directive the daemon applied."""
    sm_clock_mhz: int | None
    """The clock the daemon applied (EndPhaseResponse.sm_clock_mhz; 0 on the wire is None here)."""
    verdict: DirectiveVerdict
    duration_s: float
    energy_j: float
    gpus: int


@dataclass(frozen=True, slots=True)
class JobObservation:
    """What :meth:`JobController.observe` made of a phase's reports: counted or dropped, and why."""

    accepted: bool
    reason: str
    observation: PhaseObservation | None


@dataclass(frozen=True, slots=True)
class GuardConfig:
    """Tuning of the iteration guard (see the module docstring)."""

    window: int = 24
    """Committed iterations judged together (ratio of their summed predicted and measured wall times)."""
    tolerance: float = 0.004
    """Back off (lift committed clocks a step) when the window's ratio is under threshold − tolerance."""
    trim_margin: float = 0.004
    """Trim committed clocks a step when the window's ratio is above threshold + this."""
    lift_fraction: float = 0.02
    """One step moves committed clocks by this fraction of the top clock (snapped to the grid)."""
    max_lift_steps: int = 6
    max_trim_steps: int = 6
    predictor_window: int = 24


MIN_STRAGGLER_BAND = 0.06
"""A node of the faster half at least this much slower than the fastest (or more, where the nodes' own
speeds spread wider: :class:`NodeSpread`) straggled in that phase."""


def fast_half(durations: Sequence[float]) -> list[float]:
    """The faster half of the nodes' phase times (⌈n/2⌉ of them), fastest first."""
    ordered = sorted(durations)
    return ordered[: max(1, math.ceil(len(ordered) / 2))]


def typical_duration(durations: Sequence[float], band: float | None = None) -> float:
    """A phase's job-level duration: the mean of the faster half of the nodes (⌈n/2⌉ of them), less those
    more than ``band`` slower than the fastest.

    A straggler only ever slows its node, so the typical node is read from the fast side: a phase where half
    the nodes straggle (about 1 % of phases when each straggles 12 % of the time, on 8 nodes) moves the
    median by the stragglers' whole slowdown, and a default phase like that among the first four leaves the
    yardstick every trial is judged by several percent long for the whole run. Averaging the half rather
    than taking one order statistic keeps the per-GPU noise down. On few nodes the half itself can hold a
    straggler (4 nodes straggling 20 % of the time: 3 of them in 3 % of phases; `multinode-straggle-4-h100`
    seed 2 drew one among its 4 baseline phases, +6 %, and ran the whole job 1.7 % slower than it judged),
    so a node of the half far behind the fastest is left out. The wall time is the slowest node's: the
    iteration guard scales by it.
    """
    half = fast_half(durations)
    limit = half[0] * (1.0 + (MIN_STRAGGLER_BAND if band is None else band))
    clean = [d for d in half if d <= limit]
    return float(sum(clean) / len(clean))


class StragglerEnergy:
    """A phase's job-level energy as it would have been without its stragglers.

    A straggler costs energy that does not depend on the clock: its own extra busy time, and every other
    node waiting for it (the phase ends with its slowest node). On 12 nodes where each straggles 6 % of the
    phases at 1.3-2x, half the phases hold one, and a 2x training straggler adds about a fifth to the
    job's energy: trials read as costing more energy than the default (on `multinode-straggle-12-gb200`
    seed 3 the training curve's energy ratio rose above 1 at every clock under 1860 MHz, and the job
    stayed at the default governor). Each node's energy is read as busy power over its own time plus
    waiting power over the rest of the phase, ``E = p_busy·d + p_wait·(D − d)``: the busy power is the
    phase's own (it follows the clock), the waiting power one for the job, fitted over its recent phases
    (one phase of 3 nodes cannot tell the two apart). A phase with a straggler is then priced with every
    node past the straggler limit (the fastest times 1 + the band) held at that limit; one without keeps
    its measured sum. Arithmetic in Python floats: no BLAS kernel decides a clock.
    """

    def __init__(self, history: int = 64) -> None:
        self._phases: deque[tuple[float, float]] = deque(maxlen=history)

    def wait_power(self) -> float | None:
        """The job's waiting power per node (W) over its recent phases; None before any phase tells."""
        ww = sum(phase[1] for phase in self._phases)
        if ww <= 0.0:
            return None
        return max(0.0, sum(phase[0] for phase in self._phases) / ww)

    def observe(self, durations: Sequence[float], energies: Sequence[float]) -> None:
        """Take one phase's node times and energies (its share of the waiting power's fit: the energies and
        waits with what the node times explain taken out)."""
        phase_s = max(durations)
        waits = [phase_s - d for d in durations]
        dd = sum(d * d for d in durations)
        if dd <= 0.0:
            return
        wait_on_d = sum(w * d for w, d in zip(waits, durations, strict=True)) / dd
        energy_on_d = sum(e * d for e, d in zip(energies, durations, strict=True)) / dd
        wait_left = [w - wait_on_d * d for w, d in zip(waits, durations, strict=True)]
        energy_left = [e - energy_on_d * d for e, d in zip(energies, durations, strict=True)]
        spread = sum(w * w for w in wait_left)
        if spread > 1e-9 * phase_s * phase_s:
            self._phases.append((sum(e * w for e, w in zip(energy_left, wait_left, strict=True)), spread))

    def energy(
        self, durations: Sequence[float], energies: Sequence[float], band: float | None = None
    ) -> float:
        """The phase's energy with its stragglers held at the straggler limit (its measured sum if none)."""
        total = float(sum(energies))
        limit = min(durations) * (1.0 + (MIN_STRAGGLER_BAND if band is None else band))
        p_wait = self.wait_power()
        if max(durations) <= limit or p_wait is None:
            return total
        phase_s = max(durations)
        dd = sum(d * d for d in durations)
        p_busy = sum((e - p_wait * (phase_s - d)) * d for e, d in zip(energies, durations, strict=True)) / dd
        if p_busy <= 0.0:
            return total
        held = [min(d, limit) for d in durations]
        held_phase_s = max(held)
        clean = sum(p_busy * d + p_wait * (held_phase_s - d) for d in held)
        return float(clean) if clean > 0.0 else total


class NodeSpread:
    """How far apart the faster half of the nodes usually is: the straggler band grows with it.

    Nodes differ in speed for good (silicon, cooling, power delivery: a few percent); a fixed band would
    cut a node that is only slower by nature from some phases and not others, and the typical would jump
    with the cut. The band is twice the median spread of the faster half over recent phases, at least
    :data:`MIN_STRAGGLER_BAND`.
    """

    def __init__(self, history: int = 32) -> None:
        self._spreads: deque[float] = deque(maxlen=history)

    def band(self) -> float:
        """The straggler band for the next phase."""
        if not self._spreads:
            return MIN_STRAGGLER_BAND
        ordered = sorted(self._spreads)
        return max(MIN_STRAGGLER_BAND, 2.0 * ordered[len(ordered) // 2])

    def observe(self, durations: Sequence[float]) -> None:
        """Take one phase's node times."""
        half = fast_half(durations)
        if half[0] > 0:
            self._spreads.append(half[-1] / half[0] - 1.0)


def directive_purpose(state: ControllerState, sm_clock_mhz: int | None) -> DirectivePurpose:
    """The purpose of a directive from the controller's state and clock (see the module docstring)."""
    if sm_clock_mhz is None:
        return DirectivePurpose.CONTROL
    if state in (ControllerState.EXPLORING, ControllerState.RETUNING):
        return DirectivePurpose.TRIAL
    if state in (ControllerState.COMMITTED, ControllerState.FIXED):
        return DirectivePurpose.COMMITTED
    return DirectivePurpose.CONTROL


def common_clocks(grids: Iterable[Iterable[int]]) -> tuple[int, ...]:
    """The SM clocks every non-empty grid offers, ascending (empty when no grid is non-empty)."""
    offered = [set(grid) for grid in grids]
    offered = [grid for grid in offered if grid]
    return tuple(sorted(set.intersection(*offered))) if offered else ()


@dataclass(slots=True)
class _Iteration:
    """What the guard collects about one iteration: each kind's workload, typical time and clock."""

    workloads: dict[PhaseKind, Workload]
    typical: dict[PhaseKind, float]
    slowest: dict[PhaseKind, float] = field(default_factory=dict)
    at_default: bool = True
    trial: bool = False
    """A trial ran in this iteration: the search's own cost, not what the guard judges."""
    peer_s: float | None = None
    """Async pools: the peer pool's time in this iteration (the iteration lasts as long as the slower)."""


class JobController:
    """One controller for a whole job: plans every phase's directive and learns from complete reports."""

    def __init__(
        self,
        settings: ControllerSettings,
        nodes: int,
        *,
        incarnation: int = 1,
        controller: Controller | None = None,
        guard: GuardConfig | None = None,
    ) -> None:
        if nodes < 1:
            raise ValidationError("nodes", "must be at least 1")
        if incarnation < 1:
            raise ValidationError("incarnation", "must be at least 1")
        if controller is None:
            controller = controller_factory(DEFAULT_CONTROLLER, job=True)(settings)
        self._inner = controller
        self._settings = settings
        self._nodes = nodes
        self._incarnation = incarnation
        self._guard = guard or GuardConfig()
        self._clocks = tuple(sorted(settings.supported_sm_clocks_mhz))
        self._epoch = 0
        self._directives: dict[PhaseKind, Directive] = {}
        """The latest directive per kind: its clock is the kind's planned clock."""
        self._session_epochs: dict[int, int] = {}
        self._spread = NodeSpread()
        self._straggler_energy = StragglerEnergy()
        self._predictors = {
            kind: BaselinePredictor(kind, self._guard.predictor_window) for kind in settings.kinds
        }
        self._window: deque[tuple[float, float]] = deque(maxlen=self._guard.window)
        """(predicted default wall time, measured wall time) of the iterations being judged."""
        self._iterations: dict[int, _Iteration] = {}
        self._lift_steps = 0
        self._guard_history: deque[Decision] = deque(maxlen=128)
        self._last_end_s: float | None = None
        """When the last phase's reports were judged: the work between phases starts there."""
        self._gap_before: tuple[PhaseKind, int, float] | None = None
        """The planned phase and the time since the last phase ended (its observation's gap)."""

    # ------------------------------------------------------------------ interface

    @property
    def nodes(self) -> int:
        """Nodes whose reports make a phase complete."""
        return self._nodes

    @property
    def incarnation(self) -> int:
        """This controller's incarnation (every directive carries it)."""
        return self._incarnation

    @property
    def epoch(self) -> int:
        """The current plan epoch (0 before the first directive)."""
        return self._epoch

    @property
    def lift_steps(self) -> int:
        """The iteration guard's steps on committed clocks: positive lifts (back-off), negative trims."""
        return self._lift_steps

    def plan(self, kind: PhaseKind, iteration: int, now_s: float) -> Directive:
        """The directive of the phase about to begin, the same for every node."""
        decision = self._inner.decide(kind, iteration, None, now_s)
        clock = decision.sm_clock_mhz
        purpose = directive_purpose(decision.state, clock)
        if purpose is DirectivePurpose.COMMITTED and self._lift_steps:
            clock = self._lift(clock)
            purpose = directive_purpose(decision.state, clock)
        previous = self._directives.get(kind)
        if previous is None or previous.sm_clock_mhz != clock:
            self._epoch += 1
        directive = Directive(self._incarnation, self._epoch, iteration, kind, clock, purpose)
        self._directives[kind] = directive
        if self._last_end_s is not None:
            self._gap_before = (kind, iteration, max(0.0, now_s - self._last_end_s))
        if purpose is DirectivePurpose.TRIAL:
            self._iterations.setdefault(iteration, _Iteration({}, {})).trial = True
        return directive

    def observe(
        self,
        kind: PhaseKind,
        iteration: int,
        reports: Sequence[NodeReport],
        workload: Workload,
        now_s: float,
    ) -> JobObservation:
        """Judge a phase's reports; a complete phase is fed to the controller as one job-level observation."""
        directive = self._directives.get(kind)
        record = self._iterations.setdefault(iteration, _Iteration({}, {}))
        record.workloads[kind] = workload
        gap = self._gap_before
        gap_before_s = gap[2] if gap is not None and gap[:2] == (kind, iteration) else 0.0
        self._gap_before, self._last_end_s = None, now_s
        reason = self._incomplete(kind, iteration, reports, directive)
        if reason is not None or directive is None:
            record.at_default = False
            return JobObservation(False, reason or "no directive was planned for this phase", None)
        durations = [report.duration_s for report in reports]
        energies = [report.energy_j for report in reports]
        band = self._spread.band()
        typical = typical_duration(durations, band)
        if typical <= 0 or sum(energies) <= 0:
            record.at_default = False
            return JobObservation(False, "a node reported no duration or no energy", None)
        self._spread.observe(durations)
        energy = sum(energies)
        if min(durations) > 0 and min(energies) > 0:
            # A node without a reading (no energy counter, a phase it missed) says nothing of the powers.
            self._straggler_energy.observe(durations, energies)
            energy = self._straggler_energy.energy(durations, energies, band)
        observation = PhaseObservation(
            kind=kind,
            iteration=iteration,
            workload=workload,
            duration_s=typical,
            energy_j=energy,
            sm_clock_mhz=directive.sm_clock_mhz,
            gpus=sum(report.gpus for report in reports),
            end_time_s=now_s,
            gap_before_s=gap_before_s,
        )
        self._inner.observe(observation, now_s)
        record.typical[kind] = typical
        record.slowest[kind] = float(max(durations))
        if directive.sm_clock_mhz is None:
            predictor = self._predictors.get(kind)
            if predictor is not None:
                predictor.add(workload, typical, energy)
        else:
            record.at_default = False
        return JobObservation(True, "", observation)

    def observe_peer(self, kind: PhaseKind, iteration: int, duration_s: float, now_s: float) -> None:
        """The peer pool's job-level time for its phase of ``iteration`` (async pools; a kind this controller
        plans for is refused): its inner controller takes it as slack, its guard as the pool it waits for."""
        if kind in self._settings.kinds:
            raise ValidationError("kind", f"{kind.value} is planned here, not a peer pool's kind")
        if duration_s <= 0:
            return
        record = self._iterations.setdefault(iteration, _Iteration({}, {}))
        record.peer_s = max(duration_s, record.peer_s or 0.0)
        observation = PhaseObservation(
            kind=kind,
            iteration=iteration,
            workload=Workload(),
            duration_s=duration_s,
            energy_j=0.0,
            sm_clock_mhz=None,
            gpus=0,
            end_time_s=now_s,
        )
        self._inner.observe(observation, now_s)

    def end_iteration(self, iteration: int, wall_s: float, valid_tokens: int, now_s: float) -> None:
        """The iteration guard: the job's measured wall time against the predicted default's (async pools:
        the slower pool's time, see the module docstring; ``wall_s`` only has to be positive)."""
        record = self._iterations.pop(iteration, None)
        for old in [i for i in self._iterations if i < iteration]:
            del self._iterations[old]
        if record is None or wall_s <= 0 or valid_tokens <= 0:
            return
        kinds = self._settings.kinds
        if any(kind not in record.workloads for kind in kinds):
            return
        if record.at_default or record.trial or any(kind not in record.typical for kind in kinds):
            return
        if self._settings.mode is ExecutionMode.ASYNC:
            own = sum(record.slowest[kind] for kind in kinds)
            wall_s = max(own, record.peer_s or 0.0)
        predicted = self._predicted_default_wall_s(record, wall_s)
        if predicted is None:
            return
        self._window.append((predicted, wall_s))
        if len(self._window) < self._guard.window:
            return
        ratio = sum(p for p, _ in self._window) / sum(w for _, w in self._window)
        threshold = self._settings.throughput_threshold
        guard = self._guard
        if ratio < threshold - guard.tolerance and self._lift_steps < guard.max_lift_steps:
            self._lift_steps += 1
            verb = "under"
        elif ratio > threshold + guard.trim_margin and self._lift_steps > -guard.max_trim_steps:
            self._lift_steps -= 1
            verb = "above"
        else:
            return
        self._window.clear()
        self._note(
            iteration,
            now_s,
            ratio,
            f"iteration guard: job throughput {ratio:.3f} {verb} {threshold:.3f}; "
            f"committed clocks {self._lift_steps:+d} step(s)",
        )

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        """The inner controller's view per phase kind."""
        return self._inner.snapshot()

    def decisions(self) -> Sequence[Decision]:
        """The inner controller's history and the guard's back-offs, oldest first."""
        merged = [*self._inner.decisions(), *self._guard_history]
        return sorted(merged, key=lambda decision: decision.time_s)

    # ------------------------------------------------------------------ internals

    def _incomplete(
        self, kind: PhaseKind, iteration: int, reports: Sequence[NodeReport], directive: Directive | None
    ) -> str | None:
        """Why these reports do not make a complete phase under ``directive`` (None: they do)."""
        restarted = []
        for report in reports:
            previous = self._session_epochs.get(report.node_rank)
            if previous is not None and previous != report.session_epoch:
                restarted.append(report.node_rank)
            self._session_epochs[report.node_rank] = report.session_epoch
        if directive is None or directive.iteration != iteration:
            return "no directive was planned for this phase"
        ranks = sorted(report.node_rank for report in reports)
        if ranks != list(range(self._nodes)):
            missing = sorted(set(range(self._nodes)) - set(ranks))
            if missing:
                return f"node(s) {', '.join(map(str, missing))} did not report"
            return "a report from an unknown or repeated node rank"
        for report in reports:
            if report.kind is not kind or report.iteration != iteration:
                return (
                    f"node {report.node_rank} reported another phase ({report.kind.value} {report.iteration})"
                )
        if restarted:
            return f"node(s) {', '.join(map(str, restarted))} reopened their session"
        for report in reports:
            if report.verdict is not DirectiveVerdict.ACCEPTED:
                return f"node {report.node_rank}: directive {report.verdict.value}"
            if report.applied_epoch != directive.epoch:
                return f"node {report.node_rank} applied epoch {report.applied_epoch}, not {directive.epoch}"
            if report.sm_clock_mhz != directive.sm_clock_mhz:
                return (
                    f"node {report.node_rank} applied {report.sm_clock_mhz} MHz, not {directive.sm_clock_mhz}"
                )
        return None

    def _predicted_default_wall_s(self, record: _Iteration, wall_s: float) -> float | None:
        """What this iteration would have lasted under the default governor.

        Each phase's typical default time (the guard's predictors) is scaled by this iteration's own
        slowest-to-typical ratio of that phase (the same stragglers would have gated the default: a
        straggler's slowness does not depend on the clock); the time outside the phases is kept.
        """
        asynchronous = self._settings.mode is ExecutionMode.ASYNC
        predicted = 0.0 if asynchronous else wall_s
        for kind in self._settings.kinds:
            predictor = self._predictors.get(kind)
            prediction = None if predictor is None else predictor.predict(record.workloads[kind])
            if prediction is None or predictor is None or predictor.count < 3:
                return None
            gate = record.slowest[kind] / record.typical[kind]
            predicted += prediction.duration_s * gate - (0.0 if asynchronous else record.slowest[kind])
        return max(predicted, record.peer_s or 0.0) if asynchronous else predicted

    def _lift(self, clock: int | None) -> int | None:
        """``clock`` moved by the guard's steps: up snapped up to the grid (the top clock means the default),
        down (a trim) snapped down, never below the lowest clock."""
        if clock is None or not self._clocks:
            return clock
        wanted = clock + self._lift_steps * self._guard.lift_fraction * self._clocks[-1]
        if self._lift_steps < 0:
            return self._clocks[max(0, bisect.bisect_right(self._clocks, wanted) - 1)]
        index = bisect.bisect_left(self._clocks, wanted)
        if index >= len(self._clocks) - 1:
            return None
        return self._clocks[index]

    def _note(self, iteration: int, now_s: float, ratio: float, reason: str) -> None:
        for kind in self._settings.kinds:
            planned = self._directives.get(kind)
            self._guard_history.append(
                Decision(
                    kind,
                    iteration,
                    None if planned is None else planned.sm_clock_mhz,
                    self._inner.state_of(kind) or ControllerState.OFF,
                    reason,
                    now_s,
                    throughput_ratio=ratio,
                )
            )


def make_job_controller(
    settings: ControllerSettings, nodes: int, incarnation: int, policy: str = DEFAULT_CONTROLLER
) -> JobController:
    """A JobController over the controller named ``policy`` (``eerl``, ``fixed``, ``off``); ``eerl`` is
    tuned for a job (:data:`eerl.control.eerl.JOB_CONFIG`)."""
    factory = controller_factory(policy, job=True)
    return JobController(settings, nodes, incarnation=incarnation, controller=factory(settings))
