"""The job-level controller tells its controller how long the work between the phases took."""

from __future__ import annotations

from eerl.job import JobController

from .test_controller import GEN, SETTINGS, TRAIN, WORK, Scripted, reports


def test_each_observation_carries_the_time_since_the_previous_phase_ended() -> None:
    """The leader's clock: from judging one phase's reports to planning the next (log-probabilities,
    rewards, weight sync run there, at the default governor)."""
    inner = Scripted()
    job = JobController(SETTINGS, 2, controller=inner)
    now = 0.0
    for iteration, gaps in enumerate(((0.0, 20.0), (1.5, 18.0))):
        for kind, gap_s in zip((GEN, TRAIN), gaps, strict=True):
            now += gap_s
            directive = job.plan(kind, iteration, now)
            now += 60.0
            sent = reports(directive.epoch, directive.sm_clock_mhz, kind, iteration, [60.0, 61.0])
            job.observe(kind, iteration, sent, WORK, now)
    assert [o.gap_before_s for o in inner.observed] == [0.0, 20.0, 1.5, 18.0]
