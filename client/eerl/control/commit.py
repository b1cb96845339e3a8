"""The commit: when the searching kinds hold their allocation, and what committing resets.

The searching kinds commit together, once their coarse trials are done, no re-baseline is pending and every
allocated clock has enough trials since the search began (two for a local re-tune or an exhausted search,
else ``commit_samples``). The model chose the clocks; the commit is judged on the *measurements*: when the
median of the allocated clocks' trials misses the threshold at iteration level, the kind that falls short
the most gets a floor ("search above it") instead — once its baseline is fresh: a miss judged against a
predictor last checked long ago first gets one default phase, which re-checks the yardstick every trial's
ratio is measured against.
"""

from __future__ import annotations

from collections.abc import Sequence

from eerl.control.budget import Allocation
from eerl.control.config import EerlConfig
from eerl.control.monitor import reset_for_commit
from eerl.control.plan import Planner
from eerl.control.retune import judge_refine_outcome
from eerl.control.search import coarse_pending, raise_floor, settle
from eerl.control.state import KindTrack, RefinePace
from eerl.phases import ControllerState


def try_commit(
    tracks: Sequence[KindTrack], planner: Planner, pace: RefinePace, iteration: int, config: EerlConfig
) -> str | None:
    """Commit the allocation once every searching kind's allocated clock is measured well enough.

    Returns the verdict's reason: the commit, or the floor a failing trial set; None when not ready.
    """
    searching = [t for t in tracks if t.searching]
    if not ready_to_plan(searching):
        return None
    plan = planner.plan(tracks, iteration)
    if not measured_enough(searching, plan, config):
        return None
    failing = failing_kind(plan, tracks, planner)
    if failing is not None:
        clock = plan.sm_clock_mhz[failing.kind]
        assert clock is not None
        if iteration - failing.baseline.last_default_iteration > config.baseline_check_age:
            failing.baseline.check_pending = True
            return f"trial at {clock} MHz measured below the threshold: re-checking the baseline first"
        raise_floor(failing.search, clock, iteration)
        return f"trial at {clock} MHz measured below the threshold: search above it"
    judge_refine_outcome(pace, plan, config)
    pace.committed_throughput = plan.throughput_ratio
    for track in searching:
        commit_track(track, plan.sm_clock_mhz.get(track.kind))
    return (
        f"commit: expected throughput {plan.throughput_ratio:.3f}, energy {plan.energy_ratio:.3f} "
        "of the predicted default"
    )


def ready_to_plan(searching: Sequence[KindTrack]) -> bool:
    """No searching kind has coarse trials or a re-baseline left."""
    if any(coarse_pending(t.search) for t in searching):
        return False
    return not any(t.baseline.rebaseline_left > 0 for t in searching)


def measured_enough(searching: Sequence[KindTrack], plan: Allocation, config: EerlConfig) -> bool:
    """Every searching kind's allocated clock has its trials since the search began (default: none)."""
    exhausted = any(t.search.trials_in_search >= config.max_exploration_phases for t in searching)
    for track in searching:
        clock = plan.sm_clock_mhz.get(track.kind)
        if clock is None:
            continue
        count = len(track.curve.trials_at(clock, track.search.epoch_iteration))
        local = track.state is ControllerState.RETUNING
        if count < (2 if exhausted or local else config.commit_samples):
            return False
    return True


def failing_kind(plan: Allocation, tracks: Sequence[KindTrack], planner: Planner) -> KindTrack | None:
    """The searching kind whose measured trials put the allocation below the threshold, if any.

    Sync: the iteration's measured time (each kind's default time × the median time ratio of its trials at
    the allocated clock, plus the work between the phases) against the threshold; the kind that adds the
    most time fails. An async pool alone: its own trials against its time cap.
    """
    if planner.async_pool:
        track = tracks[0]
        clock = plan.sm_clock_mhz.get(track.kind)
        if clock is None:
            return None
        measured = track.curve.measured_at(clock, track.search.epoch_iteration)
        return track if measured is not None and measured[0] > planner.time_cap(track, tracks) else None
    measured_time = default_time = planner.between_s  # the work between runs at default either way
    worst: tuple[float, KindTrack] | None = None
    for track in tracks:
        clock = plan.sm_clock_mhz.get(track.kind)
        ratio = 1.0
        if clock is not None:
            measured = track.curve.measured_at(clock, track.search.epoch_iteration)
            ratio = measured[0] if measured is not None else 1.0
        default_s = track.baseline.default_duration_s
        measured_time += default_s * ratio
        default_time += default_s
        excess = default_s * (ratio - 1.0)
        if clock is not None and track.searching and (worst is None or excess > worst[0]):
            worst = (excess, track)
    if default_time / max(measured_time, 1e-12) < planner.target_now(tracks) and worst:
        return worst[1]
    return None


def commit_track(track: KindTrack, clock_mhz: int | None) -> None:
    """Commit one kind at ``clock_mhz`` (None: the default governor), with its measured ratios there."""
    track.committed_mhz = clock_mhz
    track.state = ControllerState.COMMITTED
    settle(track.search)
    reset_for_commit(track.monitor)
    measured = (
        track.curve.measured_at(clock_mhz, track.search.epoch_iteration) if clock_mhz is not None else None
    )
    track.committed_ratios = (1.0, 1.0) if measured is None else measured[:2]
