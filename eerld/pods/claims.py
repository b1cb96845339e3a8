"""Which sessions hold a GPU that left its pod (Kubernetes): the decision, as pure logic.

A job on a per-GPU (CDI) socket or on a pod's grant holds its GPUs through its session. When its pod ends,
its processes die and its Attach stream, or at worst its lease, ends the session. A session that outlives
its pod all the same (a lingering process, heartbeats from outside the pod) would keep the GPU claimed,
and perhaps locked low, while the kubelet gives it to the next pod. :class:`PodClaims` remembers, per
session, which pods the kubelet allocated each of its GPUs to when a listing first showed the GPU allocated
after the session opened, and names the sessions to end once a GPU is allocated to none of those pods.

It takes the kubelet's listings and the time as arguments and does no I/O; :mod:`eerld.pods.watch` polls the
kubelet and ends the sessions. The rules, each for a reason:

- A GPU no listing has shown allocated since the session opened is not judged: a host process, a node
  without Kubernetes, a GPU outside the device plugin's care keep their sessions.
- Pods are compared by namespace and name, not container (the device manager hands an init container's
  devices on to the pod's app containers). Under time-slicing a GPU has several pods: the session keeps it
  while any of the pods that held it at first sight still does.
- A GPU counts as gone only when every successful listing for ``confirm_s`` or more, in a row, showed it
  away: a kubelet that has just restarted can list a short set of pods for a moment. A listing that failed
  breaks the row: the kubelet not answering never ends a session.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eerld.pods.owners import DeviceAllocation, PodOwner, pods_by_uuid

__all__ = ["LeftPod", "PodClaims"]

SessionGpus = Mapping[str, Sequence[tuple[int, str]]]
"""Session id -> the GPUs it holds, as (index, UUID)."""


@dataclass(frozen=True, slots=True)
class LeftPod:
    """A session to end: one of its GPUs left the pods that held it."""

    session_id: str
    gpu_index: int
    gpu_uuid: str
    home: tuple[PodOwner, ...]
    """The containers the GPU was allocated to when first seen after the session opened."""
    now: tuple[PodOwner, ...]
    """The containers it is allocated to now (none: no pod)."""
    away_since_s: float

    def reason(self) -> str:
        """The session's close reason, as its log line carries it."""
        where = ", ".join(_pod(o) for o in self.now) or "no pod"
        return (
            f"GPU {self.gpu_index} left pod {', '.join(_pod(o) for o in self.home)} "
            f"(the kubelet allocates it to {where})"
        )


def _pod(owner: PodOwner) -> str:
    return f"{owner.namespace}/{owner.pod}"


class PodClaims:
    """The pods each open session's GPUs belong to, and which sessions' GPUs left them.

    Not thread-safe: one poller calls :meth:`reconcile`.
    """

    def __init__(self, *, confirm_s: float) -> None:
        self._confirm_s = confirm_s
        self._homes: dict[str, dict[str, tuple[PodOwner, ...]]] = {}
        self._away_since: dict[tuple[str, str], float] = {}

    def reconcile(
        self, sessions: SessionGpus, allocations: Sequence[DeviceAllocation] | None, now_s: float
    ) -> list[LeftPod]:
        """Take one listing of the kubelet's allocations (None: it did not answer) asked for at ``now_s``;
        return the sessions to end, one entry each.

        ``sessions`` must be those open before the listing was asked for: a session opened since could be
        judged by an allocation older than itself (its GPU's previous pod).
        """
        self._forget_all_but(sessions)
        if allocations is None:
            self._away_since.clear()  # the row of listings is broken
            return []
        gpus = {gpu for held in sessions.values() for gpu in held}
        pods = pods_by_uuid(allocations, gpus)
        left: list[LeftPod] = []
        for session_id, held in sessions.items():
            homes = self._homes.setdefault(session_id, {})
            ended: LeftPod | None = None
            for index, uuid in held:
                now = pods.get(uuid, ())
                home = homes.get(uuid)
                if home is None:
                    if now:
                        homes[uuid] = now  # first seen allocated: these pods are the session's
                    continue
                key = (session_id, uuid)
                if {_pod(o) for o in home} & {_pod(o) for o in now}:
                    self._away_since.pop(key, None)
                    continue
                since = self._away_since.setdefault(key, now_s)
                if ended is None and now_s - since >= self._confirm_s:
                    ended = LeftPod(session_id, index, uuid, home, now, since)
            if ended is not None:
                left.append(ended)
        return left

    def _forget_all_but(self, sessions: SessionGpus) -> None:
        for session_id in [s for s in self._homes if s not in sessions]:
            del self._homes[session_id]
        for key in [k for k in self._away_since if k[0] not in sessions]:
            del self._away_since[key]

    def homes(self, session_id: str) -> Mapping[str, tuple[PodOwner, ...]]:
        """GPU UUID -> the pods it belongs to, for a session the last reconcile saw (a test reads it)."""
        return dict(self._homes.get(session_id, {}))
