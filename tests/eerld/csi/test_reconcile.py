"""Crash-safety: grants of pods the kubelet no longer runs are revoked by the reconcile, never left forever.

The node plugin is driven in process here (the same object eerl-csi serves), over a real eerld and real
bind mounts; the kubelet's listing is a list the test edits. A second NodePlugin over the same state
directory is a restarted eerl-csi.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.csi.grant import grant_name
from eerld.csi.mounts import is_mount_point
from eerld.csi.node import NodePlugin
from eerld.testing import DaemonHandle
from tests.eerld.csi.conftest import Listing, grant_names, make_plugin, publish, uuids
from tests.eerld.csi.harness import POD_USER, FakeKubelet, Pod, volume_id


@pytest.fixture
def plugin(csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing) -> Iterator[NodePlugin]:
    p = make_plugin(csi_dir, kubelet, node, listing)
    yield p
    p.close()


class TestReconcile:
    def test_a_deleted_pods_grant_is_revoked_at_the_second_reconcile_that_misses_it(
        self, plugin: NodePlugin, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        pod, stays = Pod("rl", "gone", (uuids(node)[0],)), Pod("rl", "stays", (uuids(node)[1],))
        listing.pods = [pod, stays]
        target = publish(plugin, kubelet, pod)
        publish(plugin, kubelet, stays)
        listing.pods = [stays]
        first = plugin.reconcile()
        after_first = grant_names(node)
        second = plugin.reconcile()
        assert (first.revoked, first.suspected) == ((), (grant_name(volume_id(pod)),))
        assert grant_name(volume_id(pod)) in after_first
        assert second.revoked == (grant_name(volume_id(pod)),)
        assert grant_names(node) == [grant_name(volume_id(stays))]
        assert not is_mount_point(target)

    def test_a_pod_missing_from_one_listing_only_keeps_its_grant(
        self, plugin: NodePlugin, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        """A kubelet restarting with a short list costs no live pod its grant."""
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        listing.pods = [pod]
        target = publish(plugin, kubelet, pod)
        listing.pods = []
        plugin.reconcile()
        listing.pods = [pod]
        outcome = plugin.reconcile()
        listing.pods = []
        third = plugin.reconcile()
        assert outcome.revoked == ()
        assert third.revoked == ()
        assert is_mount_point(target)
        assert grant_names(node) == [grant_name(volume_id(pod))]

    def test_a_kubelet_that_does_not_answer_revokes_nothing(
        self, plugin: NodePlugin, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        listing.pods = [pod]
        publish(plugin, kubelet, pod)
        listing.pods = None
        outcomes = [plugin.reconcile() for _ in range(3)]
        assert all(o.skipped and not o.revoked for o in outcomes)
        assert grant_names(node) == [grant_name(volume_id(pod))]

    def test_a_restarted_plugin_revokes_the_grants_of_pods_deleted_while_it_was_away(
        self, csi_dir: Path, plugin: NodePlugin, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        listing.pods = [pod]
        publish(plugin, kubelet, pod)
        plugin.close()  # eerl-csi dies; the pod is deleted meanwhile, its unpublish never came
        listing.pods = []
        restarted = make_plugin(csi_dir, kubelet, node, listing)
        try:
            revoked = [restarted.reconcile().revoked for _ in range(2)]
        finally:
            restarted.close()
        assert revoked == [(), (grant_name(volume_id(pod)),)]
        assert grant_names(node) == []

    def test_a_csi_grant_no_record_names_is_revoked_and_other_grants_are_left_alone(
        self, plugin: NodePlugin, node: DaemonHandle, listing: Listing
    ) -> None:
        with grpc.insecure_channel(f"unix:{node.admin_socket_path}") as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            for name, index in (("csi-0123456789abcdef", 0), ("job-admins", 1)):
                request = pb.GrantRequest(name=name, gpus=[pb.GpuRef(index=index)], uid=POD_USER)
                admin.Grant(request, timeout=10)
        revoked = [plugin.reconcile().revoked for _ in range(2)]
        assert revoked == [(), ("csi-0123456789abcdef",)]
        assert grant_names(node) == ["job-admins"]


class TestPublishRetiresStaleVolumes:
    def test_a_pod_recreated_under_its_name_gets_the_gpus_of_the_old_one(
        self, plugin: NodePlugin, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        """The old pod's unpublish has not come: the kubelet gave its GPU to the new pod; its grant goes."""
        gpu = uuids(node)[2]
        old = Pod("rl", "trainer-0", (gpu,))
        listing.pods = [old]
        old_target = publish(plugin, kubelet, old)
        new = Pod("rl", "trainer-0", (gpu,))
        listing.pods = [new]
        publish(plugin, kubelet, new)
        assert grant_names(node) == [grant_name(volume_id(new))]
        assert not is_mount_point(old_target)
