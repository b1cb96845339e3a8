"""Fit a built-in profile's power and roofline parameters to the shipped measured sweeps (run once, offline).

``python -m perf.fit_measured a100-sxm|a40 [--iterations 800] [--start FIELD=VALUE ...]`` prints the fitted
idle, leakage, SM and memory power, voltage knee and floor, roofline exponent and power limit; the numbers
are then written by hand into ``sim/eerl_sim/profiles.py``, where ``eerl-bench calibration`` and the suite
check them. The search is Nelder-Mead from the profile's current values (or ``--start``'s) over what
``eerl-bench calibration`` reports: the squared rms errors of each dataset's total, a term for each
kernel's own fit (ratios and watts, :func:`eerl_sim.calibration.workload_costs`), and a penalty once the
energy minimum is more than 15 MHz off (``--energy-min-slack``). It is not part of any test: its result
is the numbers in the profile.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import numpy as np
from eerl_sim.calibration import compare, fit_dataset
from eerl_sim.measured import MeasuredDataset, measured_datasets
from eerl_sim.profiles import GpuProfile, builtin_profile

FITTED = (
    "idle_power_w",
    "leak_power_w",
    "sm_power_w",
    "mem_power_w",
    "v_knee_mhz",
    "v_floor",
    "roofline_exponent",
    "power_limit_w",
)
STEPS = (10.0, 20.0, 50.0, 40.0, 60.0, 0.05, 1.0, 10.0)
"""Initial simplex step of each fitted field."""

Vector = np.ndarray[tuple[int], np.dtype[np.float64]]


def with_values(profile: GpuProfile, values: Vector) -> GpuProfile | None:
    """The profile with the fitted fields set; None where they are out of range."""
    fields = dict(zip(FITTED, (float(v) for v in values), strict=True))
    if min(fields.values()) < 0 or not 0.3 < fields["v_floor"] <= 1.0 or fields["roofline_exponent"] < 1.5:
        return None
    top = profile.sm_clock_max_mhz - profile.sm_clock_step_mhz
    if not profile.sm_clock_min_mhz < fields["v_knee_mhz"] < top:
        return None
    if fields["power_limit_w"] <= fields["idle_power_w"]:
        return None
    return profile.with_overrides(fields)


def nelder_mead(cost: Callable[[Vector], float], start: Vector, steps: Vector, iterations: int) -> Vector:
    """A plain Nelder-Mead minimisation (the cost has steps where the power limit moves a grid clock)."""
    points = [start] + [start + np.eye(len(start))[i] * steps[i] for i in range(len(start))]
    values = [cost(p) for p in points]
    for _ in range(iterations):
        order = np.argsort(values)
        points, values = [points[i] for i in order], [values[i] for i in order]
        centre = np.mean(points[:-1], axis=0)
        reflected = centre + (centre - points[-1])
        value = cost(reflected)
        if value < values[0]:
            expanded = centre + 2 * (centre - points[-1])
            expanded_value = cost(expanded)
            better = expanded_value < value
            points[-1], values[-1] = (expanded, expanded_value) if better else (reflected, value)
        elif value < values[-2]:
            points[-1], values[-1] = reflected, value
        else:
            contracted = centre + 0.5 * (points[-1] - centre)
            contracted_value = cost(contracted)
            if contracted_value < values[-1]:
                points[-1], values[-1] = contracted, contracted_value
            else:
                points = [points[0]] + [points[0] + 0.5 * (p - points[0]) for p in points[1:]]
                values = [values[0]] + [cost(p) for p in points[1:]]
    best: Vector = points[int(np.argmin(values))]
    return best


KERNEL_WEIGHT = 0.1
"""Weight of the kernels' own fits (per clock) beside the totals' errors."""
ENERGY_MIN_SLACK_MHZ = 15
ENERGY_MIN_PENALTY = 4e-4
"""Cost of each 30 MHz the energy minimum is off beyond the slack (about a 2 % rms error)."""


def objective(
    profile: GpuProfile, datasets: list[MeasuredDataset], slack_mhz: float = ENERGY_MIN_SLACK_MHZ
) -> float:
    """What the search minimises (see the module doc)."""
    total = 0.0
    for dataset in datasets:
        fits = fit_dataset(profile, dataset)
        c = compare(profile, dataset, fits)
        miss = abs(c.energy_min_mhz_simulated - c.energy_min_mhz_measured) - slack_mhz
        kernels = sum(f.cost for f in fits) / (len(fits) * len(c.sm_clocks_mhz))
        total += c.rms_time_error**2 + c.rms_energy_error**2 + KERNEL_WEIGHT * kernels
        total += ENERGY_MIN_PENALTY * (max(0, miss) / 30) ** 2
    return total


def main() -> None:
    """Fit and print the profile's fields."""
    parser = argparse.ArgumentParser(prog="python -m perf.fit_measured", description=__doc__.splitlines()[0])
    parser.add_argument("profile", choices=("a100-sxm", "a40"))
    parser.add_argument("--iterations", type=int, default=800)
    parser.add_argument("--start", nargs="*", default=[], help="FIELD=VALUE starting values")
    parser.add_argument("--fix", nargs="*", default=[], choices=FITTED, help="fields kept at their start")
    parser.add_argument(
        "--energy-min-slack", type=float, default=ENERGY_MIN_SLACK_MHZ, help="MHz off before the penalty"
    )
    args = parser.parse_args()
    base = builtin_profile(args.profile)
    datasets = [d for d in measured_datasets() if d.profile == args.profile]

    def cost(values: Vector) -> float:
        profile = with_values(base, values)
        return 1e9 if profile is None else objective(profile, datasets, args.energy_min_slack)

    starts = dict(item.split("=", 1) for item in args.start)
    start = np.array([float(starts.get(name, getattr(base, name))) for name in FITTED])
    steps = np.array([0.0 if name in args.fix else step for name, step in zip(FITTED, STEPS, strict=True)])
    best = nelder_mead(cost, start, steps, args.iterations)
    best = nelder_mead(cost, best, steps / 4, args.iterations)
    print(f"cost {cost(start):.6f} -> {cost(best):.6f}")
    for name, value in zip(FITTED, best, strict=True):
        print(f"    {name}={value:.4g},")


if __name__ == "__main__":
    main()
