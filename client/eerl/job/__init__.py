"""Job mode: one clock decision per multi-node job (docs/multinode.md).

:mod:`eerl.job.controller` is the pure job-level controller (no I/O; it runs in the job's driver or rank 0);
:mod:`eerl.job.pools` keeps one such controller per GPU pool of a disaggregated job; :mod:`eerl.job.node` is
the node side (an agent's link to its node's daemon). Importing this package imports the controller only;
the controller needs the ``control`` extra (numpy).
"""

from __future__ import annotations

from eerl.job.controller import GuardConfig, JobController, JobObservation, NodeReport

__all__ = ["GuardConfig", "JobController", "JobObservation", "NodeReport"]
