"""Hand-made state for the tests of the controller's parts: fitted tracks, trials, allocations."""

from __future__ import annotations

from eerl.control.base import PhaseObservation
from eerl.control.baseline import learn_default, track_default_scale
from eerl.control.budget import Allocation
from eerl.control.config import EerlConfig
from eerl.control.curve import Trial
from eerl.control.grid import ClockGrid
from eerl.control.predictor import workload_features
from eerl.control.state import KindTrack, new_track
from eerl.phases import ControllerState, PhaseKind, Workload

from tests.client.control.synthetic import GRID_MHZ

CONFIG = EerlConfig()
GRID = ClockGrid.build(GRID_MHZ, CONFIG)
DEFAULT_S = 10.0
DEFAULT_J = 8_000.0


def workload(tokens: int = 1_000_000, longest: int = 8192) -> Workload:
    """A phase's workload; the same arguments give the same features."""
    return Workload(tokens=tokens, valid_tokens=tokens // 2, sequences=2048, max_response_tokens=longest)


def default_phase(
    kind: PhaseKind,
    iteration: int,
    work: Workload | None = None,
    duration_s: float = DEFAULT_S,
    energy_j: float = DEFAULT_J,
) -> PhaseObservation:
    """A phase on the default governor."""
    work = workload() if work is None else work
    return PhaseObservation(kind, iteration, work, duration_s, energy_j, None, 8, 0.0)


def fitted_track(
    kind: PhaseKind = PhaseKind.TRAINING,
    state: ControllerState = ControllerState.EXPLORING,
    phases: int = 4,
    duration_s: float = DEFAULT_S,
) -> KindTrack:
    """A track whose predictor learned ``phases`` identical default phases (so it predicts them exactly)."""
    track = new_track(kind, CONFIG.predictor_window, GRID.curve_bandwidth_mhz)
    for i in range(phases):
        learn_default(track.baseline, default_phase(kind, i, duration_s=duration_s), relearning=True)
    track.state = state
    return track


def add_trials(
    track: KindTrack,
    clock_mhz: int,
    *,
    time_ratio: float,
    energy_ratio: float,
    count: int = 3,
    iteration: int = 10,
) -> None:
    """``count`` trials at ``clock_mhz`` that measured these ratios against the predicted default."""
    work = workload()
    prediction = track.baseline.predictor.predict(work)
    assert prediction is not None
    for i in range(count):
        features = workload_features(track.kind, work)
        duration_s, energy_j = time_ratio * prediction.duration_s, energy_ratio * prediction.energy_j
        track.curve.add(Trial(clock_mhz, features, duration_s, energy_j, iteration + i))
        track_default_scale(track.baseline, work)


def allocation(throughput: float, energy: float, **clocks: int | None) -> Allocation:
    """An allocation naming a clock per kind (``generation=``, ``training=``)."""
    return Allocation({PhaseKind(k): c for k, c in clocks.items()}, throughput, energy)
