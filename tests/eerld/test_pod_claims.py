"""A GPU that left its pod: the pure decision (:mod:`eerld.pods.claims`) and the polling edge
(:mod:`eerld.pods.watch`) with a fake kubelet and a fake daemon, on manual time.

The attack over real sockets, as ``nobody`` on a per-GPU socket, is tests/security/test_claim_lifetime.py.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from structlog.testing import capture_logs

from eerld.daemon import ClaimView
from eerld.pods.claims import PodClaims
from eerld.pods.owners import DeviceAllocation, PodOwner, PodResourcesError, pods_by_uuid
from eerld.pods.watch import PodClaimWatch
from soak.daemon import wait_for

G0 = "GPU-0000"
G1 = "GPU-1111"
CONFIRM_S = 5.0


def gpu(uuid: str, namespace: str, pod: str, container: str = "trainer", resource: str = "nvidia.com/gpu"):
    return DeviceAllocation(namespace, pod, container, resource, (uuid,))


def sessions(**held: Sequence[tuple[int, str]]) -> dict[str, Sequence[tuple[int, str]]]:
    return dict(held)


ON_G0 = sessions(s1=[(0, G0)])


def ended(claims: PodClaims, held, allocations, now_s: float) -> list[str]:
    return [left.session_id for left in claims.reconcile(held, allocations, now_s)]


class TestPodClaims:
    def test_a_gpu_given_to_another_pod_ends_its_session_once_confirmed(self) -> None:
        claims = PodClaims(confirm_s=CONFIRM_S)
        assert ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 0.0) == []
        assert ended(claims, ON_G0, [gpu(G0, "rl", "pod2")], 5.0) == []  # away once: not yet
        [left] = claims.reconcile(ON_G0, [gpu(G0, "rl", "pod2")], 10.0)
        assert (left.session_id, left.gpu_index, left.away_since_s) == ("s1", 0, 5.0)
        assert left.reason() == "GPU 0 left pod rl/pod1 (the kubelet allocates it to rl/pod2)"

    def test_a_gpu_allocated_to_no_pod_ends_its_session_too(self) -> None:
        claims = PodClaims(confirm_s=CONFIRM_S)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 0.0)
        ended(claims, ON_G0, [], 5.0)
        [left] = claims.reconcile(ON_G0, [gpu(G1, "rl", "other")], 10.0)
        assert left.reason() == "GPU 0 left pod rl/pod1 (the kubelet allocates it to no pod)"

    def test_with_confirm_zero_one_listing_is_enough(self) -> None:
        claims = PodClaims(confirm_s=0.0)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 0.0)
        assert ended(claims, ON_G0, [], 1.0) == ["s1"]

    def test_a_gpu_never_seen_allocated_is_never_judged(self) -> None:
        """A host process or a node without Kubernetes: no listing ever names its GPU."""
        claims = PodClaims(confirm_s=0.0)
        for t in range(5):
            assert ended(claims, ON_G0, [gpu(G1, "rl", "pod1")], float(t)) == []
        assert claims.homes("s1") == {}

    def test_the_first_pod_seen_after_the_open_is_the_sessions(self) -> None:
        """Not allocated at first (a host process the scheduler does not know of), then given to pod2:
        pod2 is its home from then on, and it ends when pod2 does."""
        claims = PodClaims(confirm_s=0.0)
        ended(claims, ON_G0, [], 0.0)
        assert ended(claims, ON_G0, [gpu(G0, "rl", "pod2")], 1.0) == []
        assert claims.homes("s1") == {G0: (PodOwner("rl", "pod2", "trainer"),)}
        assert ended(claims, ON_G0, [], 2.0) == ["s1"]

    def test_a_failed_listing_ends_nothing_and_breaks_the_row(self) -> None:
        """The kubelet away between two short listings (a restart) ends no session."""
        claims = PodClaims(confirm_s=CONFIRM_S)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 0.0)
        assert ended(claims, ON_G0, [], 5.0) == []
        assert ended(claims, ON_G0, None, 10.0) == []
        assert ended(claims, ON_G0, [], 15.0) == []  # a new row starts here
        assert ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 20.0) == []
        assert ended(claims, ON_G0, [], 25.0) == []
        assert ended(claims, ON_G0, [], 30.0) == ["s1"]

    def test_a_gpu_back_in_its_pod_clears_the_away_mark(self) -> None:
        claims = PodClaims(confirm_s=CONFIRM_S)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 0.0)
        ended(claims, ON_G0, [], 5.0)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 10.0)
        assert ended(claims, ON_G0, [], 15.0) == []
        assert ended(claims, ON_G0, [], 20.0) == ["s1"]

    def test_another_container_of_the_same_pod_is_the_same_pod(self) -> None:
        """The device manager hands an init container's GPU on to the pod's app container."""
        claims = PodClaims(confirm_s=0.0)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1", container="init")], 0.0)
        assert ended(claims, ON_G0, [gpu(G0, "rl", "pod1", container="trainer")], 1.0) == []
        assert ended(claims, ON_G0, [gpu(G0, "other-ns", "pod1")], 2.0) == ["s1"]  # namespace counts

    def test_time_slicing_keeps_the_session_while_any_pod_it_began_with_holds_the_gpu(self) -> None:
        shared = "nvidia.com/gpu.shared"
        claims = PodClaims(confirm_s=0.0)
        both = [gpu(f"{G0}::0", "rl", "a", resource=shared), gpu(f"{G0}::1", "rl", "b", resource=shared)]
        ended(claims, ON_G0, both, 0.0)
        assert ended(claims, ON_G0, both[1:], 1.0) == []
        assert ended(claims, ON_G0, [gpu(f"{G0}::0", "rl", "c", resource=shared)], 2.0) == ["s1"]

    def test_a_session_with_several_gpus_ends_once_one_left_and_is_named_once(self) -> None:
        claims = PodClaims(confirm_s=0.0)
        held = sessions(s1=[(0, G0), (1, G1)])
        ended(claims, held, [gpu(G0, "rl", "pod1"), gpu(G1, "rl", "pod1")], 0.0)
        assert ended(claims, held, [gpu(G0, "rl", "pod1")], 1.0) == ["s1"]
        assert ended(claims, held, [], 2.0) == ["s1"]  # still open (the caller had not ended it yet)

    def test_a_closed_session_is_forgotten_and_a_new_one_on_its_gpu_starts_afresh(self) -> None:
        """pod1's session closed; pod2's session on the same GPU belongs to pod2."""
        claims = PodClaims(confirm_s=0.0)
        ended(claims, ON_G0, [gpu(G0, "rl", "pod1")], 0.0)
        pod2 = sessions(s2=[(0, G0)])
        assert ended(claims, pod2, [gpu(G0, "rl", "pod2")], 1.0) == []
        assert claims.homes("s1") == {}
        assert ended(claims, pod2, [gpu(G0, "rl", "pod2")], 2.0) == []

    def test_device_ids_that_are_indices_match_too(self) -> None:
        """``deviceIDStrategy=index``: the kubelet names GPU 0 "0"."""
        claims = PodClaims(confirm_s=0.0)
        ended(claims, ON_G0, [gpu("0", "rl", "pod1")], 0.0)
        assert ended(claims, ON_G0, [gpu("0", "rl", "pod2")], 1.0) == ["s1"]


def test_pods_by_uuid_lists_every_pod_of_a_gpu_once_and_ignores_other_resources() -> None:
    allocations = [
        gpu(f"{G0}::0", "rl", "a", resource="nvidia.com/gpu.shared"),
        gpu(f"{G0}::1", "rl", "a", resource="nvidia.com/gpu.shared"),
        gpu(f"{G0}::2", "rl", "b", resource="nvidia.com/gpu.shared"),
        gpu(G1, "rl", "nic", resource="example.com/nic"),
    ]
    assert pods_by_uuid(allocations, [(0, G0), (1, G1)]) == {
        G0: (PodOwner("rl", "a", "trainer"), PodOwner("rl", "b", "trainer"))
    }


# -- the polling edge --------------------------------------------------------------------------------------


@dataclass
class FakeDaemon:
    """The daemon as the watch sees it: open sessions, and the ones it was told to end."""

    open: dict[str, ClaimView] = field(default_factory=dict)
    ended: list[tuple[str, str]] = field(default_factory=list)

    def claims(self) -> Sequence[ClaimView]:
        return tuple(self.open.values())

    def end_session(self, session_id: str, reason: str) -> bool:
        self.ended.append((session_id, reason))
        return self.open.pop(session_id, None) is not None


@dataclass
class FakeLister:
    """A kubelet answering ``allocations``, or failing when ``error`` is set."""

    allocations: list[DeviceAllocation] = field(default_factory=list)
    error: Exception | None = None
    lists: int = 0
    closed: bool = False

    def list_allocations(self, timeout_s: float) -> Sequence[DeviceAllocation]:
        self.lists += 1
        if self.error is not None:
            raise self.error
        return tuple(self.allocations)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node() -> tuple[FakeDaemon, FakeLister, Clock, PodClaimWatch]:
    daemon, lister, clock = FakeDaemon(), FakeLister(), Clock()
    daemon.open["s1"] = ClaimView("s1", "pod1-uid", ((0, G0),))
    watch = PodClaimWatch(daemon, lister, poll_s=CONFIRM_S, clock=clock)
    return daemon, lister, clock, watch


class TestPodClaimWatch:
    def test_it_ends_the_session_of_a_gpu_that_left_its_pod_with_the_reason(self, node) -> None:
        daemon, lister, clock, watch = node
        lister.allocations = [gpu(G0, "rl", "pod1")]
        watch.poll_once()
        lister.allocations = [gpu(G0, "rl", "pod2")]
        with capture_logs() as logs:
            for _ in range(2):
                clock.now += CONFIRM_S
                watch.poll_once()
        assert daemon.ended == [("s1", "GPU 0 left pod rl/pod1 (the kubelet allocates it to rl/pod2)")]
        [line] = [e for e in logs if e["event"] == "pod_claim_ended"]
        assert (line["namespace"], line["pod"], line["container"], line["now"]) == (
            "rl",
            "pod1",
            "trainer",
            ["rl/pod2"],
        )

    def test_a_kubelet_that_does_not_answer_ends_nothing_and_is_logged_once(self, node) -> None:
        daemon, lister, clock, watch = node
        lister.allocations = [gpu(G0, "rl", "pod1")]
        watch.poll_once()
        lister.error = PodResourcesError("kubelet.sock: List: UNAVAILABLE")
        with capture_logs() as logs:
            for _ in range(5):
                clock.now += CONFIRM_S
                watch.poll_once()
            lister.error = None
            lister.allocations = [gpu(G0, "rl", "pod1")]
            watch.poll_once()
        assert daemon.ended == []
        assert watch.unanswered == 5
        assert [e["event"] for e in logs] == ["pod_resources_unavailable", "pod_resources_available"]

    def test_a_bug_in_the_lister_is_a_kubelet_that_did_not_answer(self, node) -> None:
        daemon, lister, clock, watch = node
        lister.allocations = [gpu(G0, "rl", "pod1")]
        watch.poll_once()
        lister.error = TypeError("boom")
        for _ in range(3):
            clock.now += CONFIRM_S
            assert watch.poll_once() == []
        assert daemon.ended == []

    def test_without_a_kubelet_on_the_node_it_lists_nothing_and_says_nothing(self) -> None:
        daemon, lister = FakeDaemon(), FakeLister()
        daemon.open["s1"] = ClaimView("s1", "host", ((0, G0),))
        watch = PodClaimWatch(daemon, lister, poll_s=CONFIRM_S, present=lambda: False)
        with capture_logs() as logs:
            watch.poll_once()
        assert (lister.lists, logs, daemon.ended) == (0, [], [])

    def test_sessions_are_read_before_the_listing_is_asked_for(self) -> None:
        """A session that opens while a listing is in flight is judged only by later listings."""
        order: list[str] = []

        class Ordered(FakeLister):
            def list_allocations(self, timeout_s: float) -> Sequence[DeviceAllocation]:
                order.append("list")
                return super().list_allocations(timeout_s)

        class Recording(FakeDaemon):
            def claims(self) -> Sequence[ClaimView]:
                order.append("claims")
                return super().claims()

        daemon = Recording()
        watch = PodClaimWatch(daemon, Ordered(), poll_s=CONFIRM_S)
        watch.poll_once()
        assert order == ["claims", "list"]

    def test_start_polls_in_the_background_and_close_stops_it_and_closes_the_lister(self, node) -> None:
        daemon, lister, _clock, _watch = node
        watch = PodClaimWatch(daemon, lister, poll_s=0.01)
        watch.start()
        try:
            wait_for(lambda: lister.lists >= 3, "three polls", 60)
        finally:
            watch.close()
        lists = lister.lists
        time.sleep(0.05)
        assert lister.closed
        assert lister.lists == lists
