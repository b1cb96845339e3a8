"""The job-level controller (eerl.job.controller): completeness, aggregation, epochs, purposes, the guard.

Pure tests: a scripted inner controller (or the real EE-RL one) and hand-made node reports, no daemon.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from eerl.control.base import ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.eerl import EerlController
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.errors import ValidationError
from eerl.job import GuardConfig, JobController, JobObservation, NodeReport
from eerl.job.controller import directive_purpose, typical_duration
from eerl.phases import ControllerState, PhaseKind, Workload

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
CLOCKS = tuple(range(345, 1981, 15))
SETTINGS = ControllerSettings(CLOCKS)
WORK = Workload(tokens=1_000_000, valid_tokens=700_000, sequences=2048, max_response_tokens=8192)


@dataclass
class Scripted:
    """An inner controller that returns scripted (clock, state) decisions and records observations."""

    plan: dict[PhaseKind, tuple[int | None, ControllerState]] = field(
        default_factory=lambda: {
            GEN: (None, ControllerState.BASELINE),
            TRAIN: (None, ControllerState.BASELINE),
        }
    )
    observed: list[PhaseObservation] = field(default_factory=list)

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        assert hints is None
        clock, state = self.plan[kind]
        return Decision(kind, iteration, clock, state, "scripted", now_s)

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        self.observed.append(observation)
        return None

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        return [PhaseSnapshot(kind, state, clock) for kind, (clock, state) in self.plan.items()]

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        return self.plan[kind][1]

    def decisions(self) -> Sequence[Decision]:
        return []


def reports(
    directive_epoch: int,
    clock: int | None,
    kind: PhaseKind,
    iteration: int,
    durations: Sequence[float],
    energies: Sequence[float] | None = None,
) -> list[NodeReport]:
    energies = energies if energies is not None else [1000.0] * len(durations)
    return [
        NodeReport(
            node_rank=rank,
            session_epoch=1,
            iteration=iteration,
            kind=kind,
            applied_epoch=directive_epoch,
            sm_clock_mhz=clock,
            verdict=DirectiveVerdict.ACCEPTED,
            duration_s=duration,
            energy_j=energy,
            gpus=8,
        )
        for rank, (duration, energy) in enumerate(zip(durations, energies, strict=True))
    ]


def phase(
    job: JobController,
    kind: PhaseKind,
    iteration: int,
    durations: Sequence[float],
    rank: int = 0,
    **changes: Any,
) -> tuple[Directive, JobObservation]:
    """Plan a phase, report it from every node (node ``rank`` with ``changes``) and observe it."""
    directive = job.plan(kind, iteration, 0.0)
    sent = reports(directive.epoch, directive.sm_clock_mhz, kind, iteration, durations)
    if changes:
        sent[rank] = replace(sent[rank], **changes)
    return directive, job.observe(kind, iteration, sent, WORK, 1.0)


class TestCompleteness:
    def test_a_complete_phase_is_fed_to_the_inner_controller(self) -> None:
        inner = Scripted()
        job = JobController(SETTINGS, 4, controller=inner)
        _, result = phase(job, GEN, 0, [10.0, 11.0, 12.0, 30.0])
        assert result.accepted
        assert result.reason == ""
        assert inner.observed == [result.observation]

    def test_a_missing_node_drops_the_phase(self) -> None:
        inner = Scripted()
        job = JobController(SETTINGS, 4, controller=inner)
        directive = job.plan(GEN, 0, 0.0)
        sent = reports(directive.epoch, None, GEN, 0, [10.0, 10.0, 10.0, 10.0])[:3]
        result = job.observe(GEN, 0, sent, WORK, 1.0)
        assert not result.accepted
        assert "3" in result.reason
        assert "did not report" in result.reason
        assert result.observation is None
        assert inner.observed == []

    def test_a_repeated_rank_drops_the_phase(self) -> None:
        job = JobController(SETTINGS, 2, controller=Scripted())
        directive = job.plan(GEN, 0, 0.0)
        sent = reports(directive.epoch, None, GEN, 0, [10.0, 10.0])
        sent[1] = replace(sent[1], node_rank=0)
        assert not job.observe(GEN, 0, sent, WORK, 1.0).accepted

    def test_a_changed_session_epoch_drops_the_phase_once(self) -> None:
        inner = Scripted()
        job = JobController(SETTINGS, 3, controller=inner)
        assert phase(job, GEN, 0, [10.0] * 3)[1].accepted
        _, dropped = phase(job, TRAIN, 0, [10.0] * 3, rank=2, session_epoch=2)
        assert not dropped.accepted
        assert "reopened" in dropped.reason
        # The new session epoch is the node's from now on: the next phase counts again.
        directive = job.plan(GEN, 1, 0.0)
        sent = reports(directive.epoch, None, GEN, 1, [10.0] * 3)
        sent[2] = replace(sent[2], session_epoch=2)
        assert job.observe(GEN, 1, sent, WORK, 1.0).accepted
        assert len(inner.observed) == 2

    @pytest.mark.parametrize("verdict", [v for v in DirectiveVerdict if v is not DirectiveVerdict.ACCEPTED])
    def test_a_verdict_other_than_accepted_drops_the_phase(self, verdict: DirectiveVerdict) -> None:
        inner = Scripted()
        job = JobController(SETTINGS, 2, controller=inner)
        _, result = phase(job, GEN, 0, [10.0, 10.0], rank=1, verdict=verdict)
        assert not result.accepted
        assert verdict.value in result.reason
        assert inner.observed == []

    def test_a_different_applied_epoch_drops_the_phase(self) -> None:
        job = JobController(SETTINGS, 2, controller=Scripted())
        directive = job.plan(GEN, 0, 0.0)
        _, result = phase(job, TRAIN, 0, [10.0, 10.0], rank=0, applied_epoch=directive.epoch + 5)
        assert not result.accepted
        assert "epoch" in result.reason

    def test_a_different_applied_clock_drops_the_phase(self) -> None:
        inner = Scripted(
            plan={GEN: (1200, ControllerState.EXPLORING), TRAIN: (None, ControllerState.BASELINE)}
        )
        job = JobController(SETTINGS, 2, controller=inner)
        _, result = phase(job, GEN, 0, [10.0, 10.0], rank=1, sm_clock_mhz=None)
        assert not result.accepted
        assert "MHz" in result.reason

    def test_a_report_for_another_phase_drops_it(self) -> None:
        job = JobController(SETTINGS, 2, controller=Scripted())
        directive = job.plan(GEN, 3, 0.0)
        sent = reports(directive.epoch, None, GEN, 3, [10.0, 10.0])
        sent[1] = replace(sent[1], iteration=2)
        result = job.observe(GEN, 3, sent, WORK, 1.0)
        assert not result.accepted

    def test_reports_without_a_directive_are_dropped(self) -> None:
        job = JobController(SETTINGS, 1, controller=Scripted())
        result = job.observe(GEN, 0, reports(1, None, GEN, 0, [10.0]), WORK, 1.0)
        assert not result.accepted


class TestAggregation:
    def test_the_duration_is_the_faster_halfs_mean_not_the_max(self) -> None:
        job = JobController(SETTINGS, 5, controller=Scripted())
        _, result = phase(job, GEN, 0, [10.0, 10.2, 9.8, 10.1, 14.0])
        assert result.observation is not None
        assert result.observation.duration_s == pytest.approx((9.8 + 10.0 + 10.1) / 3)

    def test_half_the_nodes_straggling_barely_moves_the_duration(self) -> None:
        """Stragglers only ever slow a node: with four of eight slowed by a third, the median would read
        the phase 15 % long; the faster half's mean reads the nodes that ran clean."""
        clean = [10.0, 10.1, 9.9, 10.2, 10.0, 9.8, 10.1, 10.0]
        straggled = [10.0, 10.1, 13.3, 10.2, 13.5, 9.8, 13.4, 13.0]
        readings = []
        for durations in (clean, straggled):
            job = JobController(SETTINGS, 8, controller=Scripted())
            _, result = phase(job, GEN, 0, durations)
            assert result.observation is not None
            readings.append(result.observation.duration_s)
        assert readings[1] / readings[0] == pytest.approx(1.0, abs=0.02)
        assert typical_duration(straggled) < 0.9 * statistics.median(straggled)

    def test_a_straggler_within_the_faster_half_is_left_out(self) -> None:
        """Three of four nodes slowed (one of them by 13 %): the faster half holds a straggler, and its mean
        read the phase 6 % long; the node far behind the fastest leaves it."""
        durations = [100.0, 115.2, 112.9, 126.9]
        assert typical_duration(durations) == pytest.approx(100.0)
        job = JobController(SETTINGS, 4, controller=Scripted())
        _, result = phase(job, GEN, 0, durations)
        assert result.observation is not None
        assert result.observation.duration_s == pytest.approx(100.0)

    def test_nodes_that_are_slower_by_nature_stay_in_the_typical(self) -> None:
        """Eight nodes whose speeds spread 10 % for good: after a few phases the band has widened, and the
        faster half's slowest node (8 % behind the fastest) counts in every phase instead of only in
        those where noise brought it within a fixed 6 %."""
        speeds = [0.92, 0.95, 0.97, 1.0, 1.02, 1.05, 1.08, 1.1]
        job = JobController(SETTINGS, 8, controller=Scripted())
        readings = []
        for iteration in range(6):
            durations = [100.0 * s for s in speeds]
            _, result = phase(job, GEN, iteration, durations)
            assert result.observation is not None
            readings.append(result.observation.duration_s)
            job.end_iteration(iteration, max(durations), 1000, float(iteration + 1))
        assert readings[0] == pytest.approx(100.0 * (0.92 + 0.95 + 0.97) / 3)
        assert readings[-1] == pytest.approx(100.0 * (0.92 + 0.95 + 0.97 + 1.0) / 4)

    def test_energy_and_gpus_are_summed_and_tokens_are_the_drivers(self) -> None:
        job = JobController(SETTINGS, 3, controller=Scripted())
        directive = job.plan(TRAIN, 0, 0.0)
        sent = reports(directive.epoch, None, TRAIN, 0, [5.0, 5.1, 5.2], [100.0, 200.0, 300.5])
        observation = job.observe(TRAIN, 0, sent, WORK, 2.0).observation
        assert observation is not None
        assert observation.energy_j == pytest.approx(600.5)
        assert observation.gpus == 24
        assert observation.workload == WORK
        assert observation.sm_clock_mhz is None
        assert observation.end_time_s == 2.0


BUSY_W = 8 * 700.0
WAIT_W = 8 * 100.0


def node_energies(durations: Sequence[float], busy_w: float = BUSY_W) -> list[float]:
    """Each node busy over its own time and waiting (at the waiting power) for the slowest."""
    phase_s = max(durations)
    return [busy_w * d + WAIT_W * (phase_s - d) for d in durations]


def observed_energy(job: JobController, iteration: int, durations: Sequence[float], busy_w: float) -> float:
    directive = job.plan(GEN, iteration, 0.0)
    sent = reports(directive.epoch, None, GEN, iteration, durations, node_energies(durations, busy_w))
    observation = job.observe(GEN, iteration, sent, WORK, 1.0).observation
    assert observation is not None
    job.end_iteration(iteration, max(durations), 1000, float(iteration + 1))
    return observation.energy_j


class TestStragglerEnergy:
    """A straggler's energy (its own extra time, everyone waiting for it) does not depend on the clock:
    the job's phase energy is read as it would have been without it."""

    SPEEDS = (0.98, 0.98, 0.99, 1.0, 1.0, 1.01, 1.01, 1.01, 1.02, 1.02, 1.03, 1.03)

    def test_a_straggler_on_twelve_nodes_adds_no_energy(self) -> None:
        """Twelve nodes, one at twice its time: the measured sum is a fifth over the clean phase's; the
        job reads the phase within 1 % of it (the waiting power fitted over the job's phases)."""
        job = JobController(SETTINGS, 12, controller=Scripted())
        for iteration in range(4):
            observed_energy(job, iteration, [10.0 * s for s in self.SPEEDS], BUSY_W)
        clean = [10.0 * s for s in self.SPEEDS]
        straggled = [*clean[:-1], 2.0 * clean[-1]]
        reading = observed_energy(job, 4, straggled, BUSY_W)
        assert sum(node_energies(straggled)) > 1.15 * sum(node_energies(clean))
        assert reading == pytest.approx(sum(node_energies(clean)), rel=0.01)

    def test_the_busy_power_of_the_phase_is_its_own(self) -> None:
        """The waiting power is the job's, the busy power each phase's (it follows the clock): a straggled
        phase at a lower clock's power reads at that power."""
        job = JobController(SETTINGS, 12, controller=Scripted())
        for iteration in range(4):
            observed_energy(job, iteration, [10.0 * s for s in self.SPEEDS], BUSY_W)
        clean = [11.0 * s for s in self.SPEEDS]
        straggled = [*clean[:-1], 1.6 * clean[-1]]
        reading = observed_energy(job, 4, straggled, 0.8 * BUSY_W)
        assert reading == pytest.approx(sum(node_energies(clean, 0.8 * BUSY_W)), rel=0.01)

    def test_three_nodes_learn_the_waiting_power_over_phases(self) -> None:
        """One phase of three nodes cannot tell busy from waiting power; the job's earlier phases can."""
        job = JobController(SETTINGS, 3, controller=Scripted())
        for iteration, speeds in enumerate([(0.97, 1.0, 1.04), (1.03, 0.98, 1.0), (1.0, 1.05, 0.96)] * 2):
            observed_energy(job, iteration, [10.0 * s for s in speeds], BUSY_W)
        clean = [9.8, 10.0, 10.3]
        straggled = [9.8, 10.0, 18.0]
        reading = observed_energy(job, 6, straggled, BUSY_W)
        assert sum(node_energies(straggled)) > 1.3 * sum(node_energies(clean))
        assert reading == pytest.approx(sum(node_energies(clean)), rel=0.02)

    def test_a_node_without_an_energy_reading_teaches_the_fit_nothing(self) -> None:
        """A node that read no energy (0: no counter, a missed phase) leaves the phase at its measured sum
        and out of the waiting power's fit: a later straggled phase still reads clean."""
        job = JobController(SETTINGS, 12, controller=Scripted())
        durations = [10.0 * s for s in self.SPEEDS]
        for iteration in range(4):
            observed_energy(job, iteration, durations, BUSY_W)
        straggled = [*durations[:-1], 2.0 * durations[-1]]
        unread = [*node_energies(straggled)[:-1], 0.0]
        directive = job.plan(GEN, 4, 0.0)
        sent = reports(directive.epoch, None, GEN, 4, straggled, unread)
        observation = job.observe(GEN, 4, sent, WORK, 1.0).observation
        assert observation is not None
        assert observation.energy_j == pytest.approx(sum(unread))
        job.end_iteration(4, max(straggled), 1000, 5.0)
        reading = observed_energy(job, 5, straggled, BUSY_W)
        assert reading == pytest.approx(sum(node_energies(durations)), rel=0.01)

    def test_a_phase_without_a_straggler_keeps_its_measured_energy(self) -> None:
        job = JobController(SETTINGS, 12, controller=Scripted())
        durations = [10.0 * s for s in self.SPEEDS]
        energies = [e * (1.0 + 0.01 * (i % 3)) for i, e in enumerate(node_energies(durations))]
        directive = job.plan(GEN, 0, 0.0)
        sent = reports(directive.epoch, None, GEN, 0, durations, energies)
        observation = job.observe(GEN, 0, sent, WORK, 1.0).observation
        assert observation is not None
        assert observation.energy_j == pytest.approx(sum(energies))


class TestDirectives:
    def test_epochs_grow_when_a_planned_clock_changes_and_never_go_back(self) -> None:
        inner = Scripted()
        job = JobController(SETTINGS, 1, controller=inner, incarnation=7)
        script = [
            (None, None),
            (None, None),
            (1200, None),
            (1200, 1500),
            (1200, 1500),
            (1110, 1500),
            (None, 1500),
        ]
        epochs: list[int] = []
        previous: dict[PhaseKind, int | None] = {}
        for i, (gen, train) in enumerate(script):
            for kind, clock in ((GEN, gen), (TRAIN, train)):
                state = ControllerState.BASELINE if clock is None else ControllerState.COMMITTED
                inner.plan[kind] = (clock, state)
                directive = job.plan(kind, i, float(i))
                assert directive.incarnation == 7
                assert directive.iteration == i
                assert directive.kind is kind
                assert directive.sm_clock_mhz == clock
                if kind in previous and previous[kind] != clock:
                    assert directive.epoch == epochs[-1] + 1
                epochs.append(directive.epoch)
                previous[kind] = clock
        assert epochs == sorted(epochs)
        assert job.epoch == epochs[-1] == 6

    @pytest.mark.parametrize(
        ("state", "clock", "purpose"),
        [
            (ControllerState.BASELINE, None, DirectivePurpose.CONTROL),
            (ControllerState.EXPLORING, 1200, DirectivePurpose.TRIAL),
            (ControllerState.EXPLORING, None, DirectivePurpose.CONTROL),
            (ControllerState.RETUNING, 1300, DirectivePurpose.TRIAL),
            (ControllerState.COMMITTED, 1110, DirectivePurpose.COMMITTED),
            (ControllerState.COMMITTED, None, DirectivePurpose.CONTROL),
            (ControllerState.FIXED, 1500, DirectivePurpose.COMMITTED),
            (ControllerState.OFF, None, DirectivePurpose.CONTROL),
        ],
    )
    def test_purpose_per_state(
        self, state: ControllerState, clock: int | None, purpose: DirectivePurpose
    ) -> None:
        assert directive_purpose(state, clock) is purpose
        job = JobController(
            SETTINGS, 1, controller=Scripted(plan={GEN: (clock, state), TRAIN: (None, state)})
        )
        assert job.plan(GEN, 0, 0.0).purpose is purpose

    def test_the_default_inner_controller_is_the_eerl_one(self) -> None:
        job = JobController(SETTINGS, 2)
        assert isinstance(job._inner, EerlController)  # the wrapped object is the point
        directive = job.plan(GEN, 0, 0.0)
        assert directive.sm_clock_mhz is None
        assert directive.purpose is DirectivePurpose.CONTROL

    def test_bad_arguments_are_refused(self) -> None:
        with pytest.raises(ValidationError):
            JobController(SETTINGS, 0, controller=Scripted())
        with pytest.raises(ValidationError):
            JobController(SETTINGS, 1, incarnation=0, controller=Scripted())


def run_iterations(
    job: JobController,
    inner: Scripted,
    iterations: range,
    *,
    gen_s: float,
    train_s: float,
    slow_wall: float = 1.0,
) -> None:
    """Phases whose median times are ``gen_s`` and ``train_s``; the wall time is ``slow_wall`` × their sum."""
    for i in iterations:
        for kind, seconds in ((GEN, gen_s), (TRAIN, train_s)):
            directive = job.plan(kind, i, float(i))
            sent = reports(directive.epoch, directive.sm_clock_mhz, kind, i, [seconds] * 3)
            job.observe(kind, i, sent, WORK, float(i))
        job.end_iteration(i, slow_wall * (gen_s + train_s), WORK.valid_tokens, float(i))
    assert inner.plan


class TestIterationGuard:
    def guarded(self) -> tuple[JobController, Scripted]:
        inner = Scripted()
        job = JobController(SETTINGS, 3, controller=inner, guard=GuardConfig(window=8))
        run_iterations(job, inner, range(6), gen_s=40.0, train_s=20.0)  # the default governor
        inner.plan = {GEN: (1200, ControllerState.COMMITTED), TRAIN: (1500, ControllerState.COMMITTED)}
        return job, inner

    def test_it_backs_off_when_the_job_falls_under_the_threshold(self) -> None:
        job, inner = self.guarded()
        # The committed phases take 10% longer than the default would: 0.91 of its throughput.
        run_iterations(job, inner, range(6, 14), gen_s=44.0, train_s=22.0)
        assert job.lift_steps == 1
        lifted = job.plan(GEN, 14, 14.0)
        assert lifted.sm_clock_mhz is not None
        assert lifted.sm_clock_mhz > 1200
        assert lifted.purpose is DirectivePurpose.COMMITTED
        guard = [d for d in job.decisions() if "iteration guard" in d.reason]
        # One decision per kind, each naming the clock planned for that kind when the guard stepped.
        assert {(d.kind, d.sm_clock_mhz) for d in guard} == {(GEN, 1200), (TRAIN, 1500)}

    def test_it_keeps_backing_off_up_to_its_bound(self) -> None:
        job, inner = self.guarded()
        run_iterations(job, inner, range(6, 200), gen_s=52.0, train_s=26.0)
        assert job.lift_steps == GuardConfig().max_lift_steps
        top = job.plan(TRAIN, 200, 200.0)
        assert top.sm_clock_mhz is None or top.sm_clock_mhz > 1500

    def test_it_holds_when_the_job_meets_the_threshold(self) -> None:
        job, inner = self.guarded()
        # 60 s default, 63 s now: 0.952 of the default throughput.
        run_iterations(job, inner, range(6, 40), gen_s=41.3, train_s=21.7)
        assert job.lift_steps == 0

    def test_it_trims_a_surplus_a_little(self) -> None:
        job, inner = self.guarded()
        run_iterations(job, inner, range(6, 100), gen_s=40.0, train_s=20.0)  # committed, yet 1.0
        assert job.lift_steps == -GuardConfig().max_trim_steps
        trimmed = job.plan(TRAIN, 100, 100.0)
        assert trimmed.sm_clock_mhz is not None
        assert trimmed.sm_clock_mhz < 1500

    def test_trials_are_not_judged(self) -> None:
        job, inner = self.guarded()
        inner.plan = {GEN: (700, ControllerState.EXPLORING), TRAIN: (900, ControllerState.EXPLORING)}
        run_iterations(job, inner, range(6, 40), gen_s=60.0, train_s=40.0)
        assert job.lift_steps == 0
