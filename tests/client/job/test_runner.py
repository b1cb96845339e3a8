"""JobRunner (the Session-like surface of RayJob and DistJob) and the framework hooks on a job object."""

from __future__ import annotations

import logging
from typing import Any

import eerl.integrations.openrlhf
import eerl.integrations.verl
import pytest
from eerl.directives import Directive, DirectivePurpose
from eerl.job.runner import JobRunner
from eerl.phases import PhaseKind, Workload

from tests.client.test_integrations import GENERATION, TRAINING, NewVerlTrainer, OpenRlhfTrainer

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING


class RecordingJob(JobRunner):
    """A job object that records what a RayJob or DistJob would fan out."""

    def __init__(self) -> None:
        self.now = 100.0
        super().__init__(clock=lambda: self.now)
        self.calls: list[tuple[Any, ...]] = []
        self.fail_begin = False

    def _begin(self, kind: PhaseKind, iteration: int) -> None:
        if self.fail_begin:
            raise RuntimeError("boom")
        self.calls.append(("begin", kind, iteration))

    def _end(self, kind: PhaseKind, iteration: int, workload: Workload) -> None:
        self.calls.append(("end", kind, iteration, workload))

    def _iteration_done(self, iteration: int, wall_s: float, valid_tokens: int) -> None:
        self.calls.append(("iteration", iteration, wall_s, valid_tokens))

    def _close(self) -> None:
        self.calls.append(("close",))


def test_phases_fan_out_and_iterations_close_themselves() -> None:
    job = RecordingJob()
    for iteration in range(2):
        with job.phase("generation", iteration) as phase:
            phase.report(tokens=10)
            job.now += 3.0
        with job.phase(TRAIN, iteration) as phase:
            phase.report(tokens=20, valid_tokens=7)
            phase.report(valid_tokens=1, max_response_tokens=4)
            job.now += 2.0
    job.close()
    job.close()
    assert job.calls == [
        ("begin", GEN, 0),
        ("end", GEN, 0, Workload(tokens=10)),
        ("begin", TRAIN, 0),
        ("end", TRAIN, 0, Workload(tokens=20, valid_tokens=8, max_response_tokens=4)),
        ("iteration", 0, 5.0, 8),
        ("begin", GEN, 1),
        ("end", GEN, 1, Workload(tokens=10)),
        ("begin", TRAIN, 1),
        ("end", TRAIN, 1, Workload(tokens=20, valid_tokens=8, max_response_tokens=4)),
        ("iteration", 1, 5.0, 8),
        ("close",),
    ]


def test_iterations_count_up_per_kind_and_an_explicit_end_wins() -> None:
    job = RecordingJob()
    with job.phase(GEN):
        pass
    job.end_iteration(0, wall_s=9.0, valid_tokens=3)
    with job.phase(GEN) as phase:
        assert phase.iteration == 1
    assert ("iteration", 0, 9.0, 3) in job.calls
    assert [c for c in job.calls if c[0] == "iteration"] == [("iteration", 0, 9.0, 3)]


def test_a_failure_inside_is_one_warning_and_the_phase_runs(caplog: pytest.LogCaptureFixture) -> None:
    job = RecordingJob()
    job.fail_begin = True
    ran = []
    with caplog.at_level(logging.WARNING, logger="eerl"):
        for iteration in range(3):
            with job.phase(GEN, iteration):
                ran.append(iteration)
    assert ran == [0, 1, 2]
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_the_verl_hook_takes_a_job_object() -> None:
    job = RecordingJob()
    trainer = NewVerlTrainer()
    hook = eerl.integrations.verl.instrument(trainer, job)
    trainer.fit(1)
    hook.remove()
    assert [c for c in job.calls if c[0] == "end"] == [
        ("end", GEN, 1, GENERATION),
        ("end", TRAIN, 1, TRAINING),
    ]


def test_the_openrlhf_hook_takes_a_job_object() -> None:
    job = RecordingJob()
    trainer = OpenRlhfTrainer()
    hook = eerl.integrations.openrlhf.instrument(trainer, job)
    trainer.fit(2)
    hook.remove()
    assert [c[1] for c in job.calls if c[0] == "end"] == [GEN, TRAIN, GEN, TRAIN]


def test_the_directives_of_recent_phases_are_remembered_and_old_ones_forgotten() -> None:
    job = RecordingJob()
    committed = DirectivePurpose.COMMITTED
    sent = {i: Directive(1, i + 1, i, GEN, 1200, committed) if i % 2 else None for i in range(100)}
    for iteration, directive in sent.items():
        job._remember_directive(GEN, iteration, directive)
    assert job.directive(GEN, 99) == sent[99]
    assert job.directive(GEN, 98) is None  # sent without one
    assert job.directive(TRAIN, 99) is None
    assert job.directive(GEN, 1) is None  # forgotten
    assert len(job._directives) <= 64
    assert all(job.directive(GEN, i) == sent[i] for i in range(68, 100))
