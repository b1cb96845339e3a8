"""The eerld daemon as a metrics source: its Status view converted to a snapshot, its events subscribed.

:class:`DaemonMetricsSource` reads one ``status()`` per scrape; :func:`subscribe` feeds the daemon's RPC
and phase events (:meth:`eerld.daemon.events.Events.subscribe`) into the in-process metrics. Both take the
daemon as :class:`MetricsDaemon`: its read model and its events.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from eerl.reports import SessionReport

from eerld.daemon.views import (
    DirectiveObserver,
    DirectiveRecord,
    PhaseObserver,
    PhaseRecord,
    RpcObserver,
    StatusView,
    Unsubscribe,
)
from eerld.grants import Grant, GrantKind
from eerld.metrics.collector import (
    DaemonSample,
    EerlMetrics,
    GpuSample,
    MetricsSnapshot,
    PhaseSample,
    PodSample,
    SessionSample,
)
from eerld.pods.owners import GpuOwners

__all__ = [
    "DaemonEvents",
    "DaemonMetricsSource",
    "DaemonReads",
    "MetricsDaemon",
    "hpc_job_of",
    "snapshot_from_status",
    "subscribe",
]

_PHASE_EVENT_RPCS = {"BeginPhase": "begin", "EndPhase": "end"}


class DaemonReads(Protocol):
    """The daemon's read model as the metrics read it (:class:`eerld.daemon.status.StatusReader` is one)."""

    def status(self) -> StatusView:
        """The whole node now."""
        ...


class DaemonEvents(Protocol):
    """The daemon's events as the metrics subscribe to them (:class:`eerld.daemon.events.Events` is one)."""

    def subscribe(
        self,
        *,
        on_rpc: RpcObserver | None = None,
        on_phase: PhaseObserver | None = None,
        on_directive: DirectiveObserver | None = None,
    ) -> Unsubscribe:
        """Call the observers after every RPC, metered phase and judged directive until unsubscribed."""
        ...


class FinishedReports(Protocol):
    """The finished sessions' reports as the metrics read them (:class:`eerld.daemon.reports.ReportStore`)."""

    def recent(self, job_id: str | None = None) -> tuple[SessionReport, ...]:
        """The kept reports, oldest first."""
        ...


class MetricsDaemon(Protocol):
    """What the metrics read from the daemon (:class:`eerld.daemon.Daemon` is one): its status through its
    read model, and its RPC, phase and directive events through a subscription."""

    @property
    def reads(self) -> DaemonReads:
        """The read model (``status()``)."""
        ...

    @property
    def events(self) -> DaemonEvents:
        """The events (``subscribe()``)."""
        ...

    @property
    def reports(self) -> FinishedReports:
        """The finished sessions' reports (``recent()``)."""
        ...


class DaemonMetricsSource:
    """The eerld daemon seen through :class:`MetricsSource` (one ``status()`` per scrape), with the
    Kubernetes owners of its GPUs where ``pods`` (the kubelet's pod-resources API) is given."""

    def __init__(
        self,
        daemon: MetricsDaemon,
        *,
        pods: GpuOwners | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.daemon = daemon
        self.pods = pods
        self._wall = wall_clock

    def metrics_snapshot(self) -> MetricsSnapshot:
        """One ``status()`` of the daemon's read model, converted; the pod owners (cached, bounded wait) where
        known."""
        status = self.daemon.reads.status()
        pods: Mapping[str, PodSample] = {}
        if self.pods is not None:
            owners = self.pods.owners((g.info.index, g.info.uuid) for g in status.gpus)
            pods = {uuid: PodSample(o.namespace, o.pod, o.container) for uuid, o in owners.items()}
        snapshot = snapshot_from_status(status, now_unix_s=self._wall(), pods=pods)
        return dataclasses.replace(snapshot, finished=self.daemon.reports.recent())


def hpc_job_of(grant: Grant | None) -> str:
    """The scheduler's job id of a session opened through ``grant``: the job id of an admin grant (the one
    the Slurm prolog makes per job: ``eerlctl grant --job-id $SLURM_JOB_ID``); empty for the shared and
    per-GPU sockets, whose sessions' job ids are only what their clients declare."""
    if grant is None or grant.kind is not GrantKind.GRANT:
        return ""
    return grant.job_id


def snapshot_from_status(
    status: StatusView, *, now_unix_s: float, pods: Mapping[str, PodSample] | None = None
) -> MetricsSnapshot:
    """Convert the daemon's Status view (pure; ``now_unix_s`` turns uptime into a start time); ``pods``
    maps GPU UUIDs to their Kubernetes containers."""
    d = status.daemon
    daemon = DaemonSample(
        version=d.version,
        backend=d.backend,
        controller=d.controller,
        dry_run=d.dry_run,
        hostname=d.hostname,
        started_at_unix_s=float(round(now_unix_s - d.uptime_s)),
    )
    gpus = tuple(
        GpuSample(
            index=g.info.index,
            uuid=g.info.uuid,
            name=g.info.name,
            pci_bus_id=g.info.pci_bus_id,
            energy_j=g.energy_mj / 1000.0,
            power_w=g.power_w,
            power_limit_w=g.power_limit_w,
            sm_clock_mhz=g.sm_clock_mhz,
            locked_sm_clock_mhz=g.locked_sm_clock_mhz,
            admin_pinned=g.pin is not None,
            degraded_reason=g.degraded_reason,
            clock_event_reasons=g.clock_event_mask,
        )
        for g in status.gpus
    )
    grants = {g.grant.name: g.grant for g in status.grants}
    sessions = tuple(
        SessionSample(
            job_id=s.job_id,
            rank=s.rank,
            gpu_indices=tuple(s.gpu_indices),
            mode=s.mode.value,
            phases=tuple(
                PhaseSample(
                    kind=p.kind,
                    state=p.state,
                    sm_clock_mhz=p.sm_clock_mhz,
                    phases=p.phases,
                    energy_j=p.energy_mj / 1000.0,
                    valid_tokens=p.valid_tokens,
                    energy_per_valid_token_j=p.energy_per_valid_token_j,
                    throughput_tokens_per_s=p.throughput_tokens_per_s,
                    estimated_savings_fraction=p.estimated_savings_fraction,
                    exploration_cost_j=p.exploration_cost_mj / 1000.0,
                    predictor_error_fraction=p.predictor_error_fraction,
                )
                for p in s.phases
            ),
            hpc_job=hpc_job_of(grants.get(s.grant)),
        )
        for s in status.sessions
    )
    return MetricsSnapshot(daemon=daemon, gpus=gpus, sessions=sessions, pods=dict(pods or {}))


def subscribe(daemon: MetricsDaemon, metrics: EerlMetrics) -> Unsubscribe:
    """Feed the daemon's RPC, phase and directive events into ``metrics``; returns the unsubscribe."""

    def on_rpc(method: str, code: str, duration_s: float) -> None:
        metrics.observe_rpc(method, code, duration_s)
        event = _PHASE_EVENT_RPCS.get(method)
        if event is not None and code == "OK":
            metrics.observe_phase_event(event, duration_s)

    def on_phase(record: PhaseRecord) -> None:
        metrics.observe_phase(record.kind, record.energy_mj / 1000.0, record.valid_tokens, record.duration_s)

    def on_directive(record: DirectiveRecord) -> None:
        metrics.observe_directive(record.verdict.value, record.kind)

    return daemon.events.subscribe(on_rpc=on_rpc, on_phase=on_phase, on_directive=on_directive)
