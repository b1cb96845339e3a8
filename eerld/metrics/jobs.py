"""The finished jobs' metrics: what each job kept in the daemon's reports used, after its sessions ended.

A session's series vanish with it (``eerl_session_*``); a job's report does not. These series sum each job's
finished sessions on this node (:class:`eerl.reports.JobReport`), labelled by ``job_id`` and ``Hostname``,
for as long as the daemon keeps their reports (the newest 256 sessions): bounded, and stable between
scrapes, so that a dashboard can show "this run used X kWh, Y % less than it would have" after the run.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from eerl.reports import SessionReport, jobs_of
from prometheus_client.core import GaugeMetricFamily, Metric

__all__ = ["job_families"]

_LABELS = ("job_id", "Hostname")


def job_families(reports: Sequence[SessionReport], hostname: str) -> Iterator[Metric]:
    """One series per finished job and figure (a figure the job does not have, e.g. an unpredicted
    throughput, is absent rather than 0)."""
    families = {
        "sessions": GaugeMetricFamily(
            "eerl_job_finished_sessions", "The job's sessions that ended on this node (kept).", labels=_LABELS
        ),
        "energy": GaugeMetricFamily(
            "eerl_job_energy_joules", "Energy of the job's finished sessions' phases.", labels=_LABELS
        ),
        "tokens": GaugeMetricFamily(
            "eerl_job_valid_tokens", "Valid training tokens of the job's finished sessions.", labels=_LABELS
        ),
        "savings": GaugeMetricFamily(
            "eerl_job_estimated_savings_ratio",
            "The controller's estimate of the energy the job saved against the predicted default governor.",
            labels=_LABELS,
        ),
        "throughput": GaugeMetricFamily(
            "eerl_job_throughput_ratio",
            "The job's phase throughput against the predicted default governor (its slowest session's).",
            labels=_LABELS,
        ),
        "threshold": GaugeMetricFamily(
            "eerl_job_threshold_ratio", "The job's throughput threshold.", labels=_LABELS
        ),
        "under": GaugeMetricFamily(
            "eerl_job_under_threshold",
            "1 when the job's throughput ended below its threshold.",
            labels=_LABELS,
        ),
        "ended": GaugeMetricFamily(
            "eerl_job_last_end_timestamp_seconds",
            "When the job's last session ended (Unix time).",
            labels=_LABELS,
        ),
    }
    for job in jobs_of(reports):
        labels = [job.job_id, hostname]
        families["sessions"].add_metric(labels, float(len(job.sessions)))
        families["energy"].add_metric(labels, job.energy_j)
        families["tokens"].add_metric(labels, float(job.valid_tokens))
        families["savings"].add_metric(labels, job.estimated_savings_fraction)
        if job.throughput_ratio is not None:
            families["throughput"].add_metric(labels, job.throughput_ratio)
        families["threshold"].add_metric(labels, job.threshold)
        families["under"].add_metric(labels, 1.0 if job.under_threshold else 0.0)
        families["ended"].add_metric(labels, job.closed_at_unix_s)
    yield from families.values()
