"""Plots of the benchmark (matplotlib, Agg backend: files only, no display)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import numpy.typing as npt
from eerl.phases import ControllerState
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from eerl_sim.bench.multinode import MultinodeReport
from eerl_sim.bench.runner import OnlineRun, RunTotals
from eerl_sim.calibration import DatasetComparison
from eerl_sim.sweep import KINDS

_STATE_COLOURS = {
    ControllerState.BASELINE: "#dddddd",
    ControllerState.EXPLORING: "#ffe08a",
    ControllerState.RETUNING: "#f7b0a8",
    ControllerState.COMMITTED: "#d8f0d0",
}


def timeline_plot(
    run: OnlineRun,
    *,
    default_iteration_energy_per_token_j: npt.NDArray[np.float64],
    default_iteration_throughput: npt.NDArray[np.float64],
    top_clock_mhz: int,
    title: str,
    path: Path,
) -> None:
    """Clock per phase, energy per token and throughput per iteration, with the controller's states shaded."""
    timeline = run.timeline
    iterations = np.arange(len(timeline.wall_s))
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for kind, marker in zip(KINDS, ("-", "--"), strict=True):
        clocks = [top_clock_mhz if c is None else c for c in timeline.sm_clock_mhz[kind]]
        axes[0].step(iterations, clocks, marker, where="post", label=f"{kind.value} clock")
    axes[0].set_ylabel("SM clock (MHz)\n(default = top)")
    axes[0].legend(loc="lower right", fontsize=8)
    valid = np.maximum(np.asarray(timeline.valid_tokens, dtype=np.float64), 1.0)
    axes[1].plot(iterations, np.asarray(timeline.energy_j) / valid, label="online", lw=1)
    axes[1].plot(iterations, default_iteration_energy_per_token_j, label="default", lw=1, alpha=0.6)
    axes[1].set_ylabel("energy / valid token (J)")
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].plot(iterations, valid / np.asarray(timeline.wall_s), label="online", lw=1)
    axes[2].plot(iterations, default_iteration_throughput, label="default", lw=1, alpha=0.6)
    axes[2].set_ylabel("valid tokens / s")
    axes[2].set_xlabel("iteration")
    axes[2].legend(loc="upper right", fontsize=8)
    # Shade by the state of the kind that is least settled in each iteration.
    order = [ControllerState.RETUNING, ControllerState.EXPLORING, ControllerState.BASELINE]
    states = []
    for index in range(len(iterations)):
        here = {timeline.state[k][index] for k in KINDS if len(timeline.state[k]) > index}
        states.append(next((s for s in order if s in here), ControllerState.COMMITTED))
    start = 0
    for i in range(1, len(states) + 1):
        if i == len(states) or states[i] != states[start]:
            for axis in axes:
                axis.axvspan(start, i, color=_STATE_COLOURS.get(states[start], "#ffffff"), lw=0, zorder=0)
            start = i
    handles = [Rectangle((0, 0), 1, 1, color=c) for c in _STATE_COLOURS.values()]
    fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.legend(
        handles,
        [s.value for s in _STATE_COLOURS],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.965),
        ncol=4,
        fontsize=8,
    )
    fig.savefig(path, dpi=90)
    plt.close(fig)


def pareto_plot(
    energy_per_token_j: npt.NDArray[np.float64],
    *,
    throughput: npt.NDArray[np.float64],
    default: RunTotals,
    best: RunTotals,
    threshold: float,
    title: str,
    path: Path,
) -> None:
    """Energy per valid token against throughput, one point per clock setting; default and best marked."""
    fig, axis = plt.subplots(figsize=(7, 5))
    e = energy_per_token_j.ravel()
    t = throughput.ravel()
    axis.scatter(t, e, s=2, color="#999999", alpha=0.3, label="fixed clock settings")
    order = np.argsort(-t)
    front_t, front_e, lowest = [], [], np.inf
    for i in order:
        if e[i] < lowest:
            lowest = e[i]
            front_t.append(t[i])
            front_e.append(e[i])
    axis.plot(front_t, front_e, color="C0", lw=1.5, label="Pareto front")
    axis.scatter(
        [default.throughput_tokens_per_s],
        [default.energy_per_valid_token_j],
        color="C3",
        s=40,
        label="default governor",
        zorder=3,
    )
    axis.scatter(
        [best.throughput_tokens_per_s],
        [best.energy_per_valid_token_j],
        color="C2",
        s=40,
        marker="*",
        label=f"best at ≥ {threshold:.2f} throughput",
        zorder=3,
    )
    axis.axvline(default.throughput_tokens_per_s * threshold, color="C2", lw=0.8, ls="--")
    keep = t >= 0.6 * default.throughput_tokens_per_s
    if keep.any():
        axis.set_xlim(float(t[keep].min()), float(t.max()) * 1.01)
        axis.set_ylim(float(e[keep].min()) * 0.98, float(e[keep].max()) * 1.02)
    axis.set_xlabel("throughput (valid tokens / s)")
    axis.set_ylabel("energy per valid token (J)")
    _finish(fig, axis, title, path)


def multinode_plot(reports: Sequence[MultinodeReport], *, threshold: float, title: str, path: Path) -> None:
    """Savings against throughput ratio, one point per run and policy (``eerl-bench multinode --plot``)."""
    fig, axis = plt.subplots(figsize=(7, 5))
    markers = {"oracle": "*", "independent": "x", "job": "o"}
    for index, (policy, marker) in enumerate(markers.items()):
        runs = [r.policies[policy] for r in reports]
        axis.scatter(
            [f.throughput_ratio for f in runs],
            [100.0 * f.savings for f in runs],
            marker=marker,
            color=f"C{index}",
            s=36,
            label=policy,
        )
    axis.axvline(threshold, color="#777777", lw=0.8, ls="--", label=f"threshold {threshold:.2f}")
    axis.axvline(threshold - 0.01, color="C3", lw=0.8, ls=":", label=f"floor {threshold - 0.01:.2f}")
    axis.set_xlabel("job throughput / default governor's")
    axis.set_ylabel("savings of energy per valid token (%)")
    _finish(fig, axis, title, path)


def _finish(fig: Figure, axis: Axes, title: str, path: Path) -> None:
    """Title and legend of a one-axis figure; write it as PNG and free it."""
    axis.set_title(title, fontsize=10)
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def calibration_plot(rows: Sequence[DatasetComparison], *, path: Path) -> None:
    """Per dataset, measured (dots) and simulated (line) time and energy ratios to the top clock."""
    fig, axes = plt.subplots(1, len(rows), figsize=(4.2 * len(rows), 3.8), squeeze=False)
    for ax, c in zip(axes[0], rows, strict=True):
        clocks = np.array(c.sm_clocks_mhz)
        ax.plot(clocks, c.measured_time_ratio, "o", ms=3, color="#1f77b4", label="time, measured")
        ax.plot(clocks, c.simulated_time_ratio, "-", color="#1f77b4", label="time, simulated")
        ax.plot(clocks, c.measured_energy_ratio, "s", ms=3, color="#d62728", label="energy, measured")
        ax.plot(clocks, c.simulated_energy_ratio, "-", color="#d62728", label="energy, simulated")
        ax.axvline(c.energy_min_mhz_measured, color="#d62728", ls=":", lw=1)
        ax.axvline(c.energy_min_mhz_simulated, color="#555555", ls="--", lw=1)
        ax.set_title(
            f"{c.dataset}\n{c.profile}: rms {c.rms_time_error:.1%} / {c.rms_energy_error:.1%}, "
            f"max {c.max_error:.1%}",
            fontsize=9,
        )
        ax.set_xlabel("locked SM clock (MHz)")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("ratio to the top clock")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
