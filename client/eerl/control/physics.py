"""A phase's time and energy against its SM clock, in the shape the physics gives them.

Trials are noisy (a phase's duration and power vary by a percent or so, and so does the predicted default
they are divided by), and neighbouring clocks differ in energy by a few tenths of a percent: a local fit
needs many trials at each clock to tell them apart, and it rounds off the kink where the voltage stops
falling, which is where generation's energy minimum sits. Every trial of a kind is explained by the same
few numbers, though (``../shared/sim-model.md``, and what measured GPUs show):

* time: a smooth roofline, ``T(f) ∝ (α (F / f)³ + 1)^(1/3)`` (α: how compute-bound the phase is, F the top
  clock), flat above the clock the default governor holds anyway (``f_d``: the power-capped clock of a
  training phase, the top clock for decoding);
* energy: static power over the time, part of it rising with the voltage, plus the compute's switching
  energy, which follows the voltage squared and not the time, plus the memory's, which follows neither:
  ``E(f) = a T + b T v(f) + c v(f)² + d`` with ``a, b, c, d ≥ 0`` and ``v`` the voltage: flat at ``v₀`` up
  to a knee ``k``, then linear up to 1 at the top clock.

The nonlinear shape parameters (α, f_d; k, v₀) are searched on grids, the linear ones fitted by weighted
least squares (non-negative: every term is a physical cost). The fit pools every clock's trials, so each
clock's estimate rests on all of them, and the knee stays a kink. Pure arithmetic: elementwise operations
and NumPy's own sums only (:mod:`eerl.control.numeric`), so the same trials give the same curve on any CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

STEP_MHZ = 30.0
"""Resolution of the searched clocks (the default governor's clock, the voltage knee)."""
MIN_CLOCKS = 4
"""Fewer distinct clocks than this leave the shape undetermined: no fit."""
_V_FLOORS = (0.52, 0.6, 0.68, 0.76, 0.85)
"""Voltage at and below the knee, against the top clock's: the coarse grid (refined around the best)."""
_RIDGE = 1e-9
"""Relative ridge on the least squares: keeps a nearly collinear design solvable, changes nothing else."""


def _compute_shares() -> FloatArray:
    """α from 0.001 (memory-bound decoding) to 20 (compute-bound), 80 values spaced geometrically."""
    ratio = 1.1335571422695565  # (20 / 0.001) ** (1 / 79), written out: no libm pow on the decision path
    values, value = [], 1e-3
    for _ in range(80):
        values.append(value)
        value *= ratio
    return np.array(values, dtype=np.float64)


_ALPHAS = _compute_shares()


@dataclass(frozen=True, slots=True)
class PhysicsFit:
    """The fitted shape of one phase kind's response to its clock."""

    top_mhz: float
    time_level: float
    compute_share: float
    default_clock_mhz: float
    energy_default_clock_mhz: float
    knee_mhz: float
    voltage_floor: float
    energy_terms: tuple[float, float, float, float]

    def time_ratio(self, clocks_mhz: FloatArray) -> FloatArray:
        """Time against the default at each clock (at or above a capped default's clock, the default's)."""
        clocks = np.asarray(clocks_mhz, dtype=np.float64)
        time = self.time_level * _roofline(clocks, self.default_clock_mhz, self.compute_share, self.top_mhz)
        return _as_default(clocks, time, self.default_clock_mhz, self.top_mhz)

    def energy_ratio(self, clocks_mhz: FloatArray) -> FloatArray:
        """Energy against the default at each clock (at or above a capped default's clock, the default's)."""
        clocks = np.asarray(clocks_mhz, dtype=np.float64)
        cap = self.energy_default_clock_mhz
        time = self.time_level * _roofline(clocks, cap, self.compute_share, self.top_mhz)
        volt = _voltage(np.minimum(clocks, cap), self.knee_mhz, self.voltage_floor, self.top_mhz)
        idle, leak, switching, memory = self.energy_terms
        energy = idle * time + leak * time * volt + switching * volt * volt + memory
        return _as_default(clocks, energy, cap, self.top_mhz)


def _as_default(clocks: FloatArray, values: FloatArray, default_mhz: float, top_mhz: float) -> FloatArray:
    """A lock at or above the clock a power-capped default holds anyway changes nothing: ratio 1 there (the
    fitted level beside it is the trials', and would read as a saving a lock cannot make)."""
    if default_mhz >= top_mhz:
        return values
    return np.where(clocks >= default_mhz, 1.0, values)


def fit(
    clocks_mhz: FloatArray,
    time_ratio: FloatArray,
    time_weight: FloatArray,
    energy_ratio: FloatArray,
    energy_weight: FloatArray,
    *,
    top_mhz: float,
) -> PhysicsFit | None:
    """Fit the shape to one ratio per distinct clock (each with its weight: how many trials, how recent).

    None where fewer than :data:`MIN_CLOCKS` clocks carry weight.
    """
    used = (time_weight > 0.0) & (energy_weight > 0.0)
    if int(used.sum()) < MIN_CLOCKS:
        return None
    f = np.asarray(clocks_mhz, dtype=np.float64)[used]
    t, wt = time_ratio[used], time_weight[used]
    e, we = energy_ratio[used], energy_weight[used]
    lowest = float(f.min())
    # Time: every (f_d, α) on the grids, then f_d on a fine grid around the best; the level τ in closed form.
    below = np.arange(top_mhz - STEP_MHZ, lowest, -STEP_MHZ)
    default_mhz, alpha, tau = _time_search(f, t, wt, np.append(top_mhz, below), top_mhz)
    if default_mhz < top_mhz:
        near = default_mhz + STEP_MHZ * np.linspace(-1.0, 1.0, 17)
        default_mhz, alpha, tau = _time_search(f, t, wt, near[(near > lowest) & (near < top_mhz)], top_mhz)
    # Energy: every (f_d, k, v₀) on a coarse grid, then a fine one around the best; the four terms by
    # non-negative least squares.
    chosen: _EnergyChoice | None = None
    for energy_default in sorted({default_mhz, top_mhz}):
        time = tau * _roofline(f, energy_default, alpha, top_mhz)
        # A knee at or above the highest trial leaves the voltage flat over every trial: the top clock's case.
        knees = np.arange(top_mhz - STEP_MHZ, lowest - 2 * STEP_MHZ, -STEP_MHZ)
        knees = np.append(top_mhz, knees[knees < float(f.max())])
        coarse = _energy_search(
            f,
            e,
            we,
            time=time,
            default_mhz=energy_default,
            knees=knees,
            floors=np.array(_V_FLOORS),
            top_mhz=top_mhz,
        )
        if coarse is None:
            continue
        fine_knees = coarse.knee_mhz + STEP_MHZ * np.linspace(-1.0, 1.0, 9)
        fine_floors = np.clip(coarse.voltage_floor + np.linspace(-0.04, 0.04, 9), 0.3, 1.0)
        fine = _energy_search(
            f,
            e,
            we,
            time=time,
            default_mhz=energy_default,
            knees=fine_knees,
            floors=fine_floors,
            top_mhz=top_mhz,
        )
        for candidate in (coarse, fine):
            if candidate is not None and (chosen is None or candidate.error < chosen.error):
                chosen = candidate
    if chosen is None:
        return None
    energy_default, knee_mhz, v_floor, energy_terms = (
        chosen.default_clock_mhz,
        chosen.knee_mhz,
        chosen.voltage_floor,
        chosen.terms,
    )
    idle, leak, switching, memory = (float(x) for x in energy_terms)
    return PhysicsFit(
        top_mhz=top_mhz,
        time_level=tau,
        compute_share=alpha,
        default_clock_mhz=default_mhz,
        energy_default_clock_mhz=energy_default,
        knee_mhz=knee_mhz,
        voltage_floor=v_floor,
        energy_terms=(idle, leak, switching, memory),
    )


def _time_search(
    clocks: FloatArray, times: FloatArray, weights: FloatArray, defaults: FloatArray, top_mhz: float
) -> tuple[float, float, float]:
    """The best (f_d, α, τ) over the given f_d (highest first) and every α.

    Every f_d at or above the highest trial gives the top clock's shape times a level (the level is free),
    so of the f_d that fit as well the first, i.e. the highest, is taken: the top clock unless the trials
    show the flat.
    """
    # T(f) / T(f_d) = R(f) / R(f_d) below f_d and 1 above, R(f) = (α (F / f)³ + 1)^(1/3): the roots are
    # taken once per clock and once per f_d, not once per pair.
    at_trials = _stretch(clocks[None, :], _ALPHAS[:, None], top_mhz)  # α × trials
    at_defaults = _stretch(defaults[None, :], _ALPHAS[:, None], top_mhz)  # α × f_d
    shapes = np.where(
        clocks[None, None, :] <= defaults[:, None, None],
        at_trials[None, :, :] / at_defaults.T[:, :, None],
        1.0,
    )
    level = (shapes * times * weights).sum(axis=2) / np.maximum(
        (shapes * shapes * weights).sum(axis=2), 1e-300
    )
    residual = times - level[:, :, None] * shapes
    sse = (weights * residual * residual).sum(axis=2)
    best_per_default = sse.min(axis=1)
    tolerance = float(best_per_default.min()) * (1.0 + 1e-6) + 1e-15 * float(weights.sum())
    at_default = int(np.argmax(best_per_default <= tolerance))
    at_alpha = int(np.argmin(sse[at_default]))
    return float(defaults[at_default]), float(_ALPHAS[at_alpha]), float(level[at_default, at_alpha])


@dataclass(frozen=True, slots=True)
class _EnergyChoice:
    error: float
    default_clock_mhz: float
    knee_mhz: float
    voltage_floor: float
    terms: FloatArray


def _energy_search(
    clocks: FloatArray,
    energies: FloatArray,
    weights: FloatArray,
    *,
    time: FloatArray,
    default_mhz: float,
    knees: FloatArray,
    floors: FloatArray,
    top_mhz: float,
) -> _EnergyChoice | None:
    """The best (k, v₀) of a grid for the energy, with its non-negative terms."""
    knee, floor = (grid.ravel() for grid in np.meshgrid(knees, floors, indexing="ij"))
    volt = _voltage(np.minimum(clocks, default_mhz)[None, :], knee[:, None], floor[:, None], top_mhz)
    design = np.stack(
        (np.broadcast_to(time, volt.shape), time[None, :] * volt, volt * volt, np.ones_like(volt)), axis=2
    )
    terms, error = _nonnegative_least_squares(design, energies, weights)
    pick = int(np.argmin(error))
    if not np.isfinite(error[pick]):
        return None
    return _EnergyChoice(float(error[pick]), default_mhz, float(knee[pick]), float(floor[pick]), terms[pick])


def _stretch(clocks: FloatArray, alpha: FloatArray | float, top: float) -> FloatArray:
    """``(α (F / f)³ + 1)^(1/3)``: the smooth roofline's time at ``f``, against a memory-bound phase's."""
    x = top / clocks
    return _cube_root(alpha * x * x * x + 1.0)


def _roofline(
    clocks: FloatArray, default_mhz: FloatArray | float, alpha: FloatArray | float, top: float
) -> FloatArray:
    """``T(f) / T(f_d)`` of the smooth roofline, flat above ``f_d``."""
    x = top / np.minimum(clocks, default_mhz)
    y = top / np.asarray(default_mhz, dtype=np.float64)
    return _cube_root((alpha * x * x * x + 1.0) / (alpha * y * y * y + 1.0))


def _voltage(
    clocks: FloatArray, knee: FloatArray | float, floor: FloatArray | float, top: float
) -> FloatArray:
    """Voltage against the top clock's: ``floor`` up to ``knee``, then linear to 1 at ``top``."""
    span = np.maximum(top - np.asarray(knee, dtype=np.float64), 1.0)
    rising = floor + (1.0 - floor) * np.clip((clocks - knee) / span, 0.0, 1.0)
    return np.where(np.asarray(knee) >= top, 1.0, rising)


def _cube_root(values: FloatArray) -> FloatArray:
    """``values ** (1/3)`` for values ≥ 1, by Newton's method (``power`` is not the same on every CPU).

    The start is the exponent's third (``frexp`` is exact), so a handful of steps reach full precision.
    """
    mantissa, exponent = np.frexp(values)
    third, rest = np.divmod(exponent, 3)
    scaled = np.ldexp(mantissa, rest)  # in [0.5, 4): the root is in [0.79, 1.59]
    root = np.ldexp(1.0 + (scaled - 1.0) / 3.0, third)
    for _ in range(6):
        root = root - (root * root * root - values) / (3.0 * root * root)
    return root


def _nonnegative_least_squares(
    design: FloatArray, values: FloatArray, weights: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """For each design in a batch (``[batch, points, terms]``), the weighted least squares with every term
    ≥ 0: the best over the subsets of terms whose unconstrained fit is non-negative (four terms: 15 subsets,
    which is exact), all subsets solved as one batch. Returns the terms and the weighted squared error (inf
    where no subset qualifies)."""
    batch, _, count = design.shape
    weighted = design * weights[None, :, None]
    gram = (weighted[:, :, :, None] * design[:, :, None, :]).sum(axis=1)
    rhs = (weighted * values[None, :, None]).sum(axis=1)
    total = float((weights * values * values).sum())
    masks = _SUBSETS[count]
    kept = masks[None, :, :, None] * masks[None, :, None, :]
    sub_gram = gram[:, None, :, :] * kept
    sub_rhs = rhs[:, None, :] * masks[None, :, :]
    diagonal = np.arange(count)
    scale = np.maximum(gram[:, diagonal, diagonal].sum(axis=1) / count, 1e-300)[:, None, None]
    # A term left out gets a unit diagonal (scaled) and no right-hand side: its solution is exactly 0.
    system = sub_gram.copy()
    system[:, :, diagonal, diagonal] += _RIDGE * scale + (1.0 - masks[None, :, :]) * scale
    terms = _cholesky_solve(system.reshape(-1, count, count), sub_rhs.reshape(-1, count)).reshape(
        batch, len(masks), count
    )
    fitted = (sub_gram * terms[:, :, None, :]).sum(axis=3)
    error = total - 2.0 * (terms * sub_rhs).sum(axis=2) + (terms * fitted).sum(axis=2)
    error = np.where((terms >= 0.0).all(axis=2), np.maximum(error, 0.0), np.inf)
    best = np.argmin(error, axis=1)
    rows = np.arange(batch)
    return terms[rows, best], error[rows, best]


def _subsets(count: int) -> FloatArray:
    """Every non-empty subset of ``count`` terms, as 0/1 rows."""
    return np.array([[float(mask >> j & 1) for j in range(count)] for mask in range(1, 1 << count)])


_SUBSETS = {4: _subsets(4)}


def _cholesky_solve(system: FloatArray, rhs: FloatArray) -> FloatArray:
    """Solve a batch of small symmetric positive-definite systems, written out elementwise."""
    batch, count, _ = system.shape
    lower = np.zeros_like(system)
    for i in range(count):
        for j in range(i + 1):
            rest = system[:, i, j] - (lower[:, i, :j] * lower[:, j, :j]).sum(axis=1)
            if i == j:
                lower[:, i, i] = np.sqrt(np.maximum(rest, 1e-300))
            else:
                lower[:, i, j] = rest / lower[:, j, j]
    forward = np.zeros((batch, count))
    for i in range(count):
        forward[:, i] = (rhs[:, i] - (lower[:, i, :i] * forward[:, :i]).sum(axis=1)) / lower[:, i, i]
    solution = np.zeros((batch, count))
    for i in range(count - 1, -1, -1):
        solution[:, i] = (forward[:, i] - (lower[:, i + 1 :, i] * solution[:, i + 1 :]).sum(axis=1)) / lower[
            :, i, i
        ]
    return solution
