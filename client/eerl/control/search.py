"""The search: which clock a searching kind tries next, and the bounds of its exploration.

A search starts with a list of *coarse* trials — the coarse descent from the top (EXPLORING), or a local
re-tune's centre and window edges (RETUNING) — run one per phase. The descent stops in its direction as
soon as a trial is too slow for the iteration's budget or has passed the energy minimum; a first trial that
is already too slow turns it upward. Then the *fine*, model-based search: the candidates are the fine grid
between the lowest clock tried (raised to a failed trial's floor) and the top, or a re-tune's window, and
the budget allocation over their estimated ratios names the clock to try (:mod:`eerl.control.plan`). A
re-tune's window slides down when the plan names the lowest clock tried.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from eerl.control.budget import Allocation
from eerl.control.config import EerlConfig
from eerl.control.grid import ClockGrid
from eerl.control.state import KindTrack, SearchState
from eerl.phases import ControllerState


def coarse_pending(search: SearchState) -> bool:
    """Coarse trials remain to be run."""
    return bool(search.coarse) and not search.coarse_stopped


def next_trial(track: KindTrack, plan: Callable[[], Allocation], grid: ClockGrid) -> tuple[int | None, str]:
    """The clock a searching kind tries next, and why: its next coarse trial, else the plan's clock.

    A re-tune whose plan lands on the lowest clock tried knows nothing below it: its window slides
    down there, with a trial a fine step below it (see :func:`slide_window_down`).
    """
    if coarse_pending(track.search):
        kind_of_trial = "coarse" if track.state is ControllerState.EXPLORING else "local"
        return track.search.coarse[0], f"{kind_of_trial} trial"
    allocation = plan()
    clock = allocation.sm_clock_mhz.get(track.kind)
    if track.state is ControllerState.RETUNING and slide_window_down(
        track.search, grid, clock, track.curve.probed_range_mhz()
    ):
        return track.search.coarse[0], f"local trial (the plan chose {clock} MHz, the lowest tried)"
    return clock, f"fine trial (plan: throughput {allocation.throughput_ratio:.3f})"


def slide_window_down(
    search: SearchState, grid: ClockGrid, planned_mhz: int | None, probed_mhz: tuple[int, int] | None
) -> bool:
    """Slide a re-tune's window down when its plan chose the lowest clock tried; True if it slid.

    The window is centred on the planned clock and the fine step below it is queued as the next trial
    (the floor still bars clocks a failed trial ruled out): a step at a time, since a trial a whole
    half-width below can be far too slow at a high threshold. Without the slide a re-tune after a step
    could only commit within its first window: the new regime's best clock may lie further off the old
    one, and the plan never chooses a clock below the lowest trial.
    """
    if search.window is None or planned_mhz is None or probed_mhz is None or planned_mhz != probed_mhz[0]:
        return False
    edge = grid.fine_below(planned_mhz)
    if edge is None or not search.floor_mhz <= edge < planned_mhz:
        return False
    search.window = grid.window_around(planned_mhz)
    search.coarse = [edge]
    search.coarse_stopped = False
    return True


def effective_floor_mhz(search: SearchState, *, searching: bool, iteration: int, config: EerlConfig) -> int:
    """The lowest clock a failed trial allows; a committed kind's floor expires with its baseline.

    The floor was judged on the baseline of its search. Kept for ever, it would bar the refine from
    moving back down once later control phases show the baseline was biased (it ratcheted a memory-bound
    generation clock upward under drift); within a control interval it keeps a commit from flapping.
    """
    if searching or iteration - search.floor_iteration < config.control_interval_phases:
        return search.floor_mhz
    return 0


def candidate_clocks(
    search: SearchState,
    grid: ClockGrid,
    probed_mhz: tuple[int, int] | None,
    committed_mhz: int | None,
    floor_mhz: int,
) -> list[int]:
    """The fine candidates of the model-based search (none before the first trial).

    From the lowest clock tried (at least the floor) up to the top: above the highest trial, estimates
    interpolate towards the default. A re-tune's window keeps the search local, unless the floor lies
    beyond it; the committed clock stays reachable.
    """
    if probed_mhz is None:
        return []
    low, high = max(probed_mhz[0], floor_mhz), grid.max_mhz
    if search.window is not None:
        inside = (max(low, search.window[0]), min(high, search.window[1]))
        # The window keeps a re-tune local, unless a failed trial pushed the floor beyond it.
        if any(inside[0] <= c <= inside[1] for c in grid.fine_mhz):
            low, high = inside
        else:
            # Pushed above everything tried lately: offer the next window above the floor.
            high = int(low + grid.retune_span_mhz)
    candidates = [c for c in grid.fine_mhz if low <= c <= high]
    if committed_mhz is not None and low <= committed_mhz <= high:  # keep it reachable
        candidates = sorted({*candidates, committed_mhz})
    return candidates


def trial_noise(error_fraction: float) -> float:
    """How far a single trial's time ratio may be off: the predictor's error, at least 1%."""
    return max(0.01, 1.25 * error_fraction)


def after_coarse_trial(
    search: SearchState,
    grid: ClockGrid,
    clock_mhz: int,
    time_ratio: float,
    energy_ratio: float,
    *,
    time_cap: float,
    noise: float,
    first: bool,
    config: EerlConfig,
) -> str | None:
    """Advance the coarse descent after a trial; the reason when it stops here.

    Too slow — beyond ``time_cap`` (the largest time ratio the iteration's budget could absorb) plus two
    ``noise`` widths — stops the descent, or turns it upward when this was the ``first`` trial; an energy
    ratio past the descent's minimum stops it too — with ``config.recheck_energy_stop`` once a repeat of
    the trial at the same clock agrees (the lower of the two readings counts): on a multi-node job a
    straggling node keeps every other one waiting, so one phase's energy can be far off, and a descent
    stopped there never learns what the clocks below cost.
    """
    if search.coarse[0] == clock_mhz:
        search.coarse.pop(0)
    recheck, search.energy_recheck = search.energy_recheck, None
    if recheck is not None and recheck[0] == clock_mhz:
        energy_ratio = min(energy_ratio, recheck[1])
    search.min_energy_ratio = min(search.min_energy_ratio, energy_ratio)
    limit = time_cap + 2.0 * noise
    if time_ratio > limit and first:
        # Too slow already at the first trial: the interesting clocks lie above it.
        upward = grid.coarse_upward(clock_mhz)
        search.coarse = upward
        search.coarse_stopped = not upward
        return None
    reason: str | None = None
    if time_ratio > limit:
        search.coarse_stopped = True
        reason = f"coarse descent stops: time ratio {time_ratio:.3f} over the budget"
    elif energy_ratio > search.min_energy_ratio + config.energy_stop_margin:
        if recheck is None and config.recheck_energy_stop:
            # One reading past the minimum: repeat this clock before the descent stops on it.
            search.energy_recheck = (clock_mhz, energy_ratio)
            search.coarse.insert(0, clock_mhz)
            return None
        search.coarse_stopped = True
        reason = f"coarse descent stops: past the energy minimum ({energy_ratio:.3f})"
    if reason is not None or not search.coarse:
        search.coarse_stopped = True
    return reason


def after_local_trial(search: SearchState, clock_mhz: int) -> None:
    """Tick off a re-tune's centre or edge trial."""
    if search.coarse[0] == clock_mhz:
        search.coarse.pop(0)
    if not search.coarse:
        search.coarse_stopped = True


def raise_floor(search: SearchState, clock_mhz: int, iteration: int) -> None:
    """A trial at ``clock_mhz`` fell short at iteration level: search above it."""
    search.floor_mhz = clock_mhz + 1
    search.floor_iteration = iteration


def restart_descent(search: SearchState, grid: ClockGrid, epoch_iteration: int) -> None:
    """Explore again from the top: the whole coarse descent, no window, no floor."""
    search.epoch_iteration = epoch_iteration
    search.window = None
    search.floor_mhz = 0
    search.trials_in_search = 0
    search.coarse = grid.coarse_schedule()
    search.coarse_stopped = False
    search.min_energy_ratio = np.inf
    search.energy_recheck = None


def start_local(search: SearchState, grid: ClockGrid, center_mhz: int, epoch_iteration: int) -> None:
    """Search the window around ``center_mhz``: trials at the centre and the window's edges first."""
    search.epoch_iteration = epoch_iteration
    search.window = grid.window_around(center_mhz)
    search.floor_mhz = 0
    search.trials_in_search = 0
    search.coarse = [center_mhz, *grid.window_edges(center_mhz)]
    search.coarse_stopped = False
    search.min_energy_ratio = np.inf
    search.energy_recheck = None


def start_model_local(
    search: SearchState, grid: ClockGrid, center_mhz: int | None, epoch_iteration: int
) -> None:
    """Search the window around ``center_mhz`` with the model alone, counting trials from the epoch on."""
    search.window = None if center_mhz is None else grid.window_around(center_mhz)
    search.coarse = []
    search.coarse_stopped = True
    search.floor_mhz = 0
    search.trials_in_search = 0
    search.epoch_iteration = epoch_iteration


def resume_model_search(search: SearchState, epoch_iteration: int) -> None:
    """Go on with a search over the whole curve, its trials from ``epoch_iteration`` on counting."""
    search.window = None
    search.coarse = []
    search.coarse_stopped = True
    search.floor_mhz = 0
    search.trials_in_search = 0
    search.step_sign = 0
    search.epoch_iteration = epoch_iteration


def settle(search: SearchState) -> None:
    """The search committed: drop its window and trial count (the floor stays, expiring on its own)."""
    search.window = None
    search.trials_in_search = 0
    search.step_sign = 0
