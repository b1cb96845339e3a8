"""eerl-csi as the kubelet drives it: a real plugin process on its socket, a real eerld, a fake kubelet.

Every call goes over the plugin's gRPC socket with the generated CSI stubs; the pod's side is an
unprivileged process of the pod's user (tests/security/attacker.py) connecting to the socket that appeared
at the volume's target path, as the sidecar in the pod would.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest

from eerld.csi import DRIVER_NAME
from eerld.csi.grant import grant_name
from eerld.csi.mounts import is_mount_point
from eerld.csi.proto import csi_pb2 as csi
from eerld.testing import DaemonHandle
from tests.eerld.csi.conftest import grant_names, holders, uuids
from tests.eerld.csi.harness import (
    POD_USER,
    CsiPlugin,
    FakeKubelet,
    Pod,
    as_pod_user,
    csi_eerld,
    open_call,
    publish_error,
    publish_request,
    volume_context,
    volume_id,
)


class TestIdentityAndNodeInfo:
    def test_it_names_itself_is_ready_and_serves_only_publish_and_unpublish(self, plugin: CsiPlugin) -> None:
        info = plugin.identity.GetPluginInfo(csi.GetPluginInfoRequest(), timeout=10)
        probe = plugin.identity.Probe(csi.ProbeRequest(), timeout=10)
        capabilities = plugin.identity.GetPluginCapabilities(csi.GetPluginCapabilitiesRequest(), timeout=10)
        node = plugin.node.NodeGetInfo(csi.NodeGetInfoRequest(), timeout=10)
        node_caps = plugin.node.NodeGetCapabilities(csi.NodeGetCapabilitiesRequest(), timeout=10)
        assert (info.name, bool(info.vendor_version)) == (DRIVER_NAME, True)
        assert probe.ready.value is True
        assert list(capabilities.capabilities) == []
        assert node.node_id == "node-a"
        assert list(node_caps.capabilities) == []

    def test_stage_is_unimplemented(self, plugin: CsiPlugin) -> None:
        with pytest.raises(grpc.RpcError) as refused:
            plugin.node.NodeStageVolume(csi.NodeStageVolumeRequest(volume_id="v"), timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNIMPLEMENTED


class TestPublish:
    def test_the_socket_at_the_target_claims_exactly_the_pods_gpus(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        gpu = uuids(node)
        pod = Pod("rl", "trainer-0", (gpu[1], gpu[2]))
        kubelet.pods = [pod, Pod("rl", "other", (gpu[0],))]
        target = kubelet.target_path(pod)
        assert plugin.publish(publish_request(pod, target)) is grpc.StatusCode.OK
        socket = target / "eerld.sock"
        st = socket.stat()
        codes = as_pod_user(
            target,
            [open_call(0, job_id=pod.uid), open_call(3, job_id=pod.uid), open_call(job_id=pod.uid)],
        )
        assert is_mount_point(target)
        assert (st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode)) == (POD_USER, POD_USER, 0o660)
        assert codes == ["PERMISSION_DENIED", "PERMISSION_DENIED", "OK"]
        assert holders(node) == {1: pod.uid, 2: pod.uid}
        assert grant_names(node) == [grant_name(volume_id(pod))]

    def test_only_the_pods_own_job_id_opens_a_session(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        plugin.publish(publish_request(pod, target))
        assert as_pod_user(target, [open_call(job_id="someone-else")]) == ["PERMISSION_DENIED"]

    def test_unpublish_revokes_the_grant_ends_its_session_and_unmounts_and_is_idempotent(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[3],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        plugin.publish(publish_request(pod, target))
        assert as_pod_user(target, [open_call(job_id=pod.uid)]) == ["OK"]
        held = holders(node)
        first = plugin.unpublish(volume_id(pod), target)
        second = plugin.unpublish(volume_id(pod), target)
        assert held == {3: pod.uid}
        assert (first, second) == (grpc.StatusCode.OK, grpc.StatusCode.OK)
        assert holders(node) == {}
        assert grant_names(node) == []
        assert not target.exists()

    def test_publishing_a_published_volume_again_changes_nothing(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        codes = [plugin.publish(publish_request(pod, target)) for _ in range(2)]
        assert codes == [grpc.StatusCode.OK, grpc.StatusCode.OK]
        assert as_pod_user(target, [open_call(job_id=pod.uid)]) == ["OK"]
        assert len(grant_names(node)) == 1

    def test_the_socket_survives_an_eerld_restart(
        self, csi_dir: Path, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        """The grant's directory is mounted, not its socket file: eerld's new socket appears in the mount."""
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        plugin.publish(publish_request(pod, target))
        node.server.stop(grace_s=0.5)
        with csi_eerld(csi_dir) as again:
            codes = as_pod_user(target, [open_call(job_id=pod.uid)])
            held = holders(again)
        assert codes == ["OK"]
        assert held == {0: pod.uid}


class TestErrorsChangeNothing:
    def assert_untouched(self, node: DaemonHandle, plugin: CsiPlugin, target: Path) -> None:
        assert grant_names(node) == []
        assert not is_mount_point(target)
        records = plugin.state_dir / "volumes.json"
        assert not records.exists() or '"volumes": []' in records.read_text()

    def test_a_pod_without_gpus_is_failed_precondition(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "cpu-only", (), extra=(("example.com/nic", ("nic-0",)),))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        code, message = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "pod rl/cpu-only has no GPU allocated by the kubelet" in message
        self.assert_untouched(node, plugin, target)

    def test_an_unknown_pod_is_not_found(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "ghost", (uuids(node)[0],))
        target = kubelet.target_path(pod)
        code, message = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.NOT_FOUND
        assert "rl/ghost is not among the kubelet's pods" in message
        self.assert_untouched(node, plugin, target)

    def test_a_bad_attribute_is_invalid_argument(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        outcomes = [
            publish_error(plugin, publish_request(pod, target, volume_context(pod, uid="-1"))),
            publish_error(plugin, publish_request(pod, target, volume_context(pod, gid="65532"))),
            publish_error(plugin, publish_request(pod, target, volume_context(pod, uid="1", mode="0666"))),
        ]
        assert [c for c, _ in outcomes] == [grpc.StatusCode.INVALID_ARGUMENT] * 3
        assert outcomes[0][1] == "volume_context: uid: '-1' is not a numeric id"
        assert "uid: required" in outcomes[1][1]
        assert "unknown attribute 'mode'" in outcomes[2][1]
        self.assert_untouched(node, plugin, target)

    def test_a_gpu_eerld_does_not_know_is_refused_by_eerld(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "trainer-0", ("GPU-not-on-this-node",))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        code, _ = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.NOT_FOUND
        self.assert_untouched(node, plugin, target)

    def test_a_kubelet_that_does_not_answer_is_unavailable(
        self, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        kubelet.stop()
        code, message = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.UNAVAILABLE
        assert "pod-resources" in message
        self.assert_untouched(node, plugin, target)
