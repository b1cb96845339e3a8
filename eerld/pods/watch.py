"""The pod-resources watch: end the session of a GPU that left its pod (Kubernetes), polling the kubelet.

Every ``poll_s`` it takes the daemon's open sessions, then lists the kubelet's allocations (waiting at most
``timeout_s``), and hands both to :class:`~eerld.pods.claims.PodClaims`, which decides; each session it names
is ended as a lease expiry ends one (its GPUs reset, its claim freed) with the reason in the log. A kubelet
that does not answer ends nothing (fail-open, one warning per outage); with ``--pod-resources-socket auto``
and no kubelet on the node it lists nothing and says nothing.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from eerld.daemon import ClaimView
from eerld.pods.claims import LeftPod, PodClaims
from eerld.pods.owners import REFRESH_S, TIMEOUT_S, DeviceAllocation, PodResourcesLister
from eerld.sessions import short_id

__all__ = ["PodClaimWatch", "SessionHolder"]

log = structlog.get_logger("eerld.pods.watch")


class SessionHolder(Protocol):
    """What the watch needs of the daemon: its session book (:class:`eerld.daemon.book.SessionBook`)."""

    def claims(self) -> Sequence[ClaimView]:
        """Every open session's GPUs."""
        ...

    def end_session(self, session_id: str, reason: str) -> bool:
        """End a session as a lease expiry does; False when it ended meanwhile."""
        ...


class PodClaimWatch:
    """Polls the kubelet in a thread of its own (:meth:`start`), ends the sessions of GPUs that left a pod."""

    def __init__(
        self,
        daemon: SessionHolder,
        lister: PodResourcesLister,
        *,
        poll_s: float = REFRESH_S,
        timeout_s: float = TIMEOUT_S,
        present: Callable[[], bool] = lambda: True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``present`` says whether the kubelet is on this node at all (``auto``: its socket exists); when
        it is not, a poll lists nothing and logs nothing. A GPU is gone from its pod once listings for
        ``poll_s`` in a row said so (:class:`~eerld.pods.claims.PodClaims`)."""
        self._daemon = daemon
        self._lister = lister
        self._poll_s = poll_s
        self._timeout_s = timeout_s
        self._present = present
        self._clock = clock
        self._claims = PodClaims(confirm_s=poll_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = False
        self.unanswered = 0
        """Polls the kubelet did not answer (a test reads it)."""

    def poll_once(self) -> list[LeftPod]:
        """One round: the sessions, then the kubelet's listing, then end what left its pod; what was ended."""
        claims = self._daemon.claims()  # before the listing is asked for (PodClaims.reconcile)
        now_s = self._clock()
        allocations = self._list()
        sessions = {c.session_id: c.gpus for c in claims}
        left = self._claims.reconcile(sessions, allocations, now_s)
        for gone in left:
            self._end(gone)
        return left

    def _list(self) -> Sequence[DeviceAllocation] | None:
        if not self._present():
            self.unanswered += 1
            return None
        try:
            allocations = tuple(self._lister.list_allocations(self._timeout_s))
        except Exception as e:  # PodResourcesError, or a lister's bug: never a session's end
            self.unanswered += 1
            if not self._failing:
                log.warning(
                    "pod_resources_unavailable",
                    error=str(e),
                    effect="no session is ended for a pod that left until the kubelet answers",
                )
            self._failing = True
            return None
        if self._failing:
            log.info("pod_resources_available")
        self._failing = False
        return allocations

    def _end(self, gone: LeftPod) -> None:
        home = gone.home[0]
        log.warning(
            "pod_claim_ended",
            session_id=short_id(gone.session_id),
            gpu_index=gone.gpu_index,
            gpu_uuid=gone.gpu_uuid,
            namespace=home.namespace,
            pod=home.pod,
            container=home.container,
            now=[f"{o.namespace}/{o.pod}" for o in gone.now],
        )
        self._daemon.end_session(gone.session_id, gone.reason())

    def start(self) -> None:
        """Poll in the background until :meth:`close`."""

        def run() -> None:
            while True:
                try:
                    self.poll_once()
                except Exception:
                    log.exception("pod_watch_error")
                if self._stop.wait(self._poll_s):
                    return

        self._thread = threading.Thread(target=run, name="eerld-pod-watch", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop polling (waiting at most for the listing in flight) and close the lister; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._timeout_s + 5)
        self._lister.close()
