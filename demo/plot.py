"""The live demo's timeline plot: clock per phase, energy per valid token and throughput per iteration.

matplotlib is slow to import and only the plot needs it, so it is imported inside the functions;
:func:`preload_plotting` warms the import while the demo runs.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from eerl.phases import ControllerState

from demo.record import Record
from demo.worker import KINDS

STATE_COLOURS = {
    ControllerState.BASELINE: "#e4e4e4",
    ControllerState.EXPLORING: "#ffe08a",
    ControllerState.RETUNING: "#f7b0a8",
    ControllerState.COMMITTED: "#d8f0d0",
    ControllerState.FIXED: "#d8e4f8",
}
"""The shading of an iteration by the controller's state (the first of these its phases were in)."""


def preload_plotting() -> None:
    """Import matplotlib while the demo runs (seconds of CPU that would otherwise delay the summary)."""
    with contextlib.suppress(ImportError):
        import matplotlib  # noqa: PLC0415 - warming the import cache only

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: PLC0415 - warming the import cache only


def timeline_plot(record: Record, *, top_clock_mhz: int, path: Path, title: str) -> None:
    """Clock per phase, energy per valid token and throughput per iteration, controller states shaded."""
    import matplotlib  # noqa: PLC0415 - slow to import, and only the plot needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    iterations = record.iterations()
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for kind, style in zip(KINDS, ("o-", "s--"), strict=True):
        views = [record.phases[(i, kind)] for i in iterations]
        clocks = [top_clock_mhz if v.run.sm_lock_mhz is None else v.run.sm_lock_mhz for v in views]
        axes[0].plot(iterations, clocks, style, ms=3, lw=1, label=f"{kind.value} lock")
    axes[0].set_ylabel(f"SM clock lock (MHz)\ndefault governor = {top_clock_mhz}")
    axes[0].legend(loc="lower left", fontsize=8)
    live = [record.totals([i], default=False) for i in iterations]
    default = [record.totals([i], default=True) for i in iterations]
    axes[1].plot(iterations, [t.energy_per_valid_token_j for t in live], "o-", ms=3, lw=1, label="live")
    axes[1].plot(
        iterations,
        [t.energy_per_valid_token_j for t in default],
        lw=1,
        alpha=0.7,
        label="default (predicted)",
    )
    axes[1].set_ylabel("energy / valid token (J)")
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].plot(iterations, [t.throughput_tokens_per_s for t in live], "o-", ms=3, lw=1, label="live")
    axes[2].plot(
        iterations, [t.throughput_tokens_per_s for t in default], lw=1, alpha=0.7, label="default (predicted)"
    )
    axes[2].set_ylabel("valid tokens / simulated s")
    axes[2].set_xlabel("RL iteration")
    axes[2].legend(loc="lower right", fontsize=8)
    for i in iterations:
        states = [v.state for v in record.iteration(i)]
        state = next((s for s in STATE_COLOURS if s in states), None)
        if state is not None:
            for axis in axes:
                axis.axvspan(i - 0.5, i + 0.5, color=STATE_COLOURS[state], lw=0, zorder=0)
    seen = [s for s in STATE_COLOURS if any(v.state is s for v in record.phases.values())]
    fig.legend(
        [Patch(color=STATE_COLOURS[s]) for s in seen],
        [f"controller {s.value}" for s in seen],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.965),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    axes[2].xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=90)
    plt.close(fig)
