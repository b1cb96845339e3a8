"""The live demo's text: one line per phase as it ends, and the summary at the end of the run.

Pure: every function turns a :class:`demo.record.Record` (and the figures it is given) into lines; the
orchestrator prints them. docs/demo.md explains how to read them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from eerl.phases import ControllerState, PhaseKind
from eerl.v1 import eerl_pb2 as pb
from eerl.wire.enums import KIND_FROM_PB, STATE_FROM_PB

from demo.record import PhaseView, Record, Totals
from eerlctl.render import job_report_text
from eerlctl.replies import job_report_dict

HEADER = (
    "iter  phase       state         clock   sim time    energy   J/valid tok  default   vs default\n"
    "----  ----------  ---------  --------  ---------  --------  ------------  -------  -----------"
)
"""The header of the per-phase lines."""


def phase_line(record: Record, view: PhaseView) -> str:
    """The line of one phase; a training phase also gets its iteration's energy per valid token."""
    run = view.run
    state = view.state.value if view.state is not None else "?"
    clock = "default" if run.sm_lock_mhz is None else f"{run.sm_lock_mhz} MHz"
    line = (
        f"{run.iteration:>4}  {run.kind.value:<10}  {state:<9}  {clock:>8}  "
        f"{run.duration_s:>7.1f} s  {run.energy_j / 1000:>6.1f} kJ"
    )
    if run.kind is PhaseKind.TRAINING and (run.iteration, PhaseKind.GENERATION) in record.phases:
        live = record.totals([run.iteration], default=False).energy_per_valid_token_j
        default = record.totals([run.iteration], default=True).energy_per_valid_token_j
        line += f"   {live:.4f}   {default:.4f}   {pct(live / default - 1):>6}"
    return line


def summary_lines(record: Record, *, controller: str, wall_s: float) -> list[str]:
    """The summary table: live against the default governor's prediction, whole run and committed part."""
    iterations = record.iterations()
    default = record.totals(iterations, default=True)
    live = record.totals(iterations, default=False)
    committed = record.committed_iterations()
    lines = [
        f"Summary · {len(iterations)} iterations, {live.duration_s:,.0f} simulated s "
        f"in {wall_s:.0f} s of wall time"
    ]
    overhead = record.overhead()
    calibrated = record.totals(iterations, default=True, overhead=overhead)
    rows: list[tuple[str, Totals, Totals | None]] = [
        ("default governor: simulator, same iterations", default, None)
    ]
    if overhead:
        rows.append(("default governor: simulator × this run's overhead¹", calibrated, None))
    rows.append((f"{controller} controller, live, whole run", live, calibrated))
    if committed:
        span = f"{len(committed)} it. from {committed[0]}"
        rows.append(
            (
                f"{controller} controller, live, committed ({span})",
                record.totals(committed, default=False),
                record.totals(committed, default=True, overhead=overhead),
            )
        )
    lines.append(f"  {'':<52}  {'J/valid tok':>11}  {'valid tok/s':>11}  {'energy':>8}  {'throughput':>10}")
    for label, totals, base in rows:
        line = (
            f"  {label:<52}  {totals.energy_per_valid_token_j:>11.4f}  "
            f"{totals.throughput_tokens_per_s:>11,.0f}"
        )
        if base is not None:
            line += f"  {pct(saving(totals, base)):>8}  {speed(totals, base):>10.1%}"
        lines.append(line)
    if overhead:
        parts = [
            f"{kind.value} time {pct(o.time - 1)}, energy {pct(o.energy - 1)} ({o.phases} phases)"
            for kind, o in overhead.items()
        ]
        lines.append(f"  ¹ live over simulator where both ran the default governor: {'; '.join(parts)}")
        lines.append(
            "    (queuing work and RPCs take wall time, which the speed-up turns into simulated s); "
            f"against the simulator alone: energy {pct(saving(live, default))}, "
            f"throughput {speed(live, default):.1%}"
        )
    if not committed and controller == "eerl":
        lines.append("  (the controller had not committed a clock pair yet: run more --iterations)")
    session = _session(record)
    if session is not None and session.throughput_threshold > 0:
        lines.append(threshold_line(speed(live, calibrated), session.throughput_threshold))
    return lines


THRESHOLD_TOLERANCE = 0.003
"""How far under its threshold a whole run may end and still count as kept: the phase-level noise no
controller can see coming (the bench's rule, docs/results-promise.md)."""


def threshold_line(achieved: float, threshold: float) -> str:
    """The whole run's throughput against the session's threshold, flagged when it ended under it."""
    percent = f"{threshold * 100:g}%"
    if math.isnan(achieved):
        return f"  throughput over the whole run: not measured (no valid tokens), threshold {percent}"
    if achieved >= threshold:
        return (
            f"  throughput over the whole run {achieved:.1%}: at or above the session's threshold ({percent})"
        )
    short = (threshold - achieved) * 100
    if threshold - achieved <= THRESHOLD_TOLERANCE:
        return (
            f"  throughput over the whole run {achieved:.1%}: {short:.1f} points under the session's "
            f"threshold ({percent}), within the {THRESHOLD_TOLERANCE * 100:.1f}-point noise tolerance"
        )
    return (
        f"  UNDER THE THRESHOLD: throughput over the whole run {achieved:.1%}, {short:.1f} points under the "
        f"session's {percent} (exploration and noise cost more than the controller planned for)"
    )


def _session(record: Record) -> pb.SessionInfo | None:
    """The demo's own session in the daemon's final Status (None when there was none)."""
    status = record.final_status
    if status is None:
        return None
    return next((s for s in status.sessions if s.session_id == record.session_id), None)


def controller_lines(record: Record) -> list[str]:
    """The controller's own view at the end (state, clock, first commit, estimate) and the daemon's meter."""
    lines: list[str] = []
    session = _session(record)
    if session is None:
        return ["  controller: no Status from eerld at the end of the run"]
    for phase in session.phases:
        kind = KIND_FROM_PB.get(phase.kind)
        if kind is None:
            continue
        state = STATE_FROM_PB.get(phase.state, ControllerState.OFF).value
        clock = f"{phase.sm_clock_mhz} MHz" if phase.sm_clock_mhz else "default"
        commit = next(
            (
                d.iteration
                for d in record.decisions
                if KIND_FROM_PB.get(d.kind) is kind and d.state == pb.CONTROLLER_STATE_COMMITTED
            ),
            None,
        )
        first = f", first committed at it. {commit}" if commit is not None else ""
        cost = phase.exploration_cost_mj / 1e9
        estimate = (
            f"; by its own estimate it saves {phase.estimated_savings_fraction:.1%} against its "
            "predicted default"
            if phase.estimated_savings_fraction
            else ""
        )
        lines.append(
            f"  controller, {kind.value}: {state} at {clock}{first}{estimate}"
            + (f" (exploration cost {cost:.2f} MJ)" if cost > 0.005 else "")
        )
    daemon_j = sum(p.energy_mj for p in session.phases) / 1000.0
    valid = sum(p.valid_tokens for p in session.phases)
    worker_j = sum(v.run.energy_j for v in record.phases.values())
    if valid and worker_j:
        lines.append(
            f"  daemon's own meter (counters at BeginPhase/EndPhase): {daemon_j / 1e6:.2f} MJ, "
            f"{daemon_j / valid:.4f} J/valid tok; the worker's meter: {worker_j / 1e6:.2f} MJ "
            f"({pct(daemon_j / worker_j - 1)})"
        )
    return lines


def job_report_lines(record: Record) -> list[str]:
    """The daemon's report of the job, as ``eerlctl report JOB_ID`` prints it (its own figures: the
    daemon's meter and the controller's predicted default, not the simulator's)."""
    if not record.reports:
        return ["  eerlctl report: the daemon gave no report of the job"]
    job = job_report_dict(record.reports[0].job_id, record.reports)
    return [
        f"eerlctl report {job['job_id']} (the daemon's own view of the finished job):",
        job_report_text(job),
    ]


def gpus_after_stop_line(locked: Sequence[int] | None, gpus: int) -> str:
    """What the simulated GPUs' state said once eerld had stopped (None: it could not be read)."""
    if locked is None:
        return "  GPUs after SIGTERM: could not read the simulated GPUs' state"
    if locked:
        return f"  GPUs after SIGTERM: LOCKED: {', '.join(map(str, locked))}"
    return f"  GPUs after SIGTERM: all {gpus} at default clocks, none locked"


def saving(totals: Totals, base: Totals) -> float:
    """Energy per valid token of ``totals`` relative to ``base`` (negative: a saving)."""
    return totals.energy_per_valid_token_j / base.energy_per_valid_token_j - 1


def speed(totals: Totals, base: Totals) -> float:
    """Throughput of ``totals`` as a fraction of ``base``'s."""
    return totals.throughput_tokens_per_s / base.throughput_tokens_per_s


def pct(fraction: float) -> str:
    """A signed percentage with a typographic minus."""
    return f"{fraction:+.1%}".replace("-", "−")
