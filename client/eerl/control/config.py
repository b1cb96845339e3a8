"""The EE-RL controller's tuning: one frozen record that every part of :mod:`eerl.control.eerl` reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class EerlConfig:
    """Tuning of the controller; the defaults are what the bench figures were measured with."""

    baseline_phases: int = 4
    coarse_factor: float = 0.88
    """Each coarse trial is this fraction of the previous clock."""
    coarse_start_fraction: float = 0.77
    """The first coarse trial, as a fraction of the top clock."""
    fine_step_fraction: float = 0.022
    """Fine candidates are spaced this fraction of the maximum clock apart (snapped to the grid)."""
    commit_samples: int = 3
    max_exploration_phases: int = 24
    planning_margin: float = 0.006
    """Plan for threshold + margin, so that predictor error rarely pushes the run below the threshold."""
    energy_stop_margin: float = 0.01
    recheck_energy_stop: bool = True
    """A coarse trial past the energy minimum is repeated before the descent stops on it (the lower reading
    counts). One reading is judged against a predictor fitted on four default phases, and a phase's energy
    is harder to predict than its time: on long chain-of-thought the decode reads of all workers, which
    the energy follows, vary more than the busiest worker's, which the time follows (`short-cot-verl-h100`
    seed 4: a trial read 4.5 % over its true energy ratio where the stop allows 1 %, the descent stopped
    two clocks above the minimum, capture 0.63). Across nodes a straggler makes the summed energy
    noisier still. Over the eight promise sets (seeds 1-5 and 6-10, 1380 runs) capture medians moved
    within +-0.002 and the worst run at 0.95 rose 0.631 -> 0.650 and 0.579 -> 0.661
    (docs/results-promise.md, "tenth")."""
    control_interval_phases: int = 60
    refine_interval_phases: int = 20
    """A committed allocation is re-checked against all trials (its own phases included) this often."""
    drift_ratio_band: float = 0.04
    drift_feature_band: float = 0.12
    step_feature_band: float = 0.5
    """A workload shift this large is a new regime: re-baseline on several default phases from scratch."""
    monitor_window: int = 10
    rebaseline_phases: int = 3
    retune_window_steps: int = 3
    refine_surplus: float = 0.003
    """A commit this far above the planned threshold may move for energy (gain > switch_gain_with_surplus)."""
    run_spend_horizon: int = 50
    """The throughput earlier phases left unused (:mod:`eerl.control.throughput`) is spent over this many
    iterations' worth of default time."""
    max_run_spend: float = 0.01
    """The plan never aims more than this below its threshold, whatever the session banked."""
    max_run_repay: float = 0.005
    """What the run owes (slow trials, a yardstick later default phases corrected) the plan repays over the
    same horizon, aiming at most this far above its threshold."""
    probe_interval_phases: int = 10
    """A committed kind runs one phase a fine step below its clock this often, while the session has
    throughput to spend: the curve keeps evidence below the commit, so the refine can move there."""
    probe_min_spend: float = 0.003
    """The banked throughput (as the plan's spend) a probe needs: it slows its phase by about a fine step."""
    switch_gain_with_surplus: float = 0.004
    max_refine_backoff: int = 8
    """A refine that ends no better than where it started doubles the refine interval, up to this factor:
    on a stationary workload the estimates of neighbours and of the commit then stop trading places."""
    history: int = 512
    predictor_window: int = 24
    baseline_check_age: int = 8
    """A trial that misses the threshold sets a floor only if the kind's newest default phase is at most
    this many iterations old; otherwise one default phase re-checks the predictor first (a stale yardstick,
    e.g. under drift, makes every clock look too slow)."""
    physics_curve: bool = True
    """Read each kind's clock curve through the physics-shaped fit (:mod:`eerl.control.physics`) once four
    clocks have trials; off, the local fit alone. Over the eight promise sets (medians at 0.90 / 0.95 / 0.98,
    seeds 1-5) it lifts capture 0.9341 / 0.9236 / 0.8971 -> 0.9367 / 0.9284 / 0.8990 and keeps the promise
    better (runs more than 0.003 under their threshold 17 -> 11 of 690; seeds 6-10: 15 -> 15;
    docs/results-promise.md, "eleventh")."""
