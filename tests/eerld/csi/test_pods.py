"""Which GPUs a pod gets (eerld.csi.pods) and what a publish request may carry (eerld.csi.volume): pure."""

from __future__ import annotations

import pytest

from eerld.csi.grant import grant_name
from eerld.csi.pods import GpuRef, pod_gpus
from eerld.csi.volume import parse_publish
from eerld.errors import Conflict, NotFound, ValidationError
from eerld.grants import is_grant_name
from eerld.pods.owners import DeviceAllocation, PodDevices

UID = "0f8e2b1c-3d4a-4b5c-8d6e-7f8091a2b3c4"
TARGET = f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/eerl/mount"


def pod(name: str, *allocations: tuple[str, tuple[str, ...]]) -> PodDevices:
    return PodDevices("rl", name, tuple(DeviceAllocation("rl", name, "c", r, ids) for r, ids in allocations))


def context(**extra: str) -> dict[str, str]:
    return {
        "uid": "65532",
        "csi.storage.k8s.io/pod.name": "trainer-0",
        "csi.storage.k8s.io/pod.namespace": "rl",
        "csi.storage.k8s.io/pod.uid": UID,
        "csi.storage.k8s.io/ephemeral": "true",
        **extra,
    }


class TestPodGpus:
    def test_every_containers_gpus_once_by_uuid_index_or_time_sliced_replica(self) -> None:
        pods = [
            pod("other", ("nvidia.com/gpu", ("GPU-a",))),
            pod(
                "trainer-0",
                ("nvidia.com/gpu", ("GPU-b", "3")),
                ("nvidia.com/gpu.shared", ("GPU-b::1", "GPU-c::0")),
                ("nvidia.com/mig-1g.10gb", ("MIG-x",)),
            ),
        ]
        assert pod_gpus(pods, "rl", "trainer-0") == (
            GpuRef(uuid="GPU-b"),
            GpuRef(index=3),
            GpuRef(uuid="GPU-c"),
        )

    def test_an_unknown_pod_and_a_pod_without_gpus_are_told_apart(self) -> None:
        pods = [pod("cpu", ("example.com/nic", ("0",)))]
        with pytest.raises(NotFound):
            pod_gpus(pods, "rl", "ghost")
        with pytest.raises(Conflict, match="has no GPU allocated by the kubelet"):
            pod_gpus(pods, "rl", "cpu")


class TestParsePublish:
    def test_a_kubelets_request_is_read(self) -> None:
        volume = parse_publish(
            "csi-abc", TARGET, context(gid="7"), kubelet_dir="/var/lib/kubelet", mount_access=True
        )
        assert (volume.pod, volume.pod_uid, volume.uid, volume.gid) == ("rl/trainer-0", UID, 65532, 7)

    @pytest.mark.parametrize(
        ("changes", "field"),
        [
            ({"uid": "root"}, "volume_context"),
            ({"uid": str(2**32)}, "volume_context"),
            ({"gpus": "0"}, "volume_context"),
            ({"csi.storage.k8s.io/pod.namespace": "RL"}, "volume_context"),
            ({"csi.storage.k8s.io/pod.uid": "../../x"}, "volume_context"),
            ({"csi.storage.k8s.io/ephemeral": "false"}, "volume_context"),
        ],
    )
    def test_a_bad_context_names_its_field(self, changes: dict[str, str], field: str) -> None:
        with pytest.raises(ValidationError) as refused:
            parse_publish(
                "csi-abc", TARGET, context(**changes), kubelet_dir="/var/lib/kubelet", mount_access=True
            )
        assert refused.value.field == field

    @pytest.mark.parametrize(
        "target",
        [
            "/etc",
            f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~csi/eerl/mount/../../../../../../etc",
            f"/var/lib/kubelet/pods/{UID}/volumes/kubernetes.io~secret/eerl/mount",
            "/var/lib/kubelet/pods/1f8e2b1c-3d4a-4b5c-8d6e-7f8091a2b3c4/volumes/kubernetes.io~csi/eerl/mount",
            "relative/path",
        ],
    )
    def test_a_target_outside_this_pods_volume_directory_is_refused(self, target: str) -> None:
        with pytest.raises(ValidationError) as refused:
            parse_publish("csi-abc", target, context(), kubelet_dir="/var/lib/kubelet", mount_access=True)
        assert refused.value.field == "target_path"

    def test_a_block_volume_is_refused(self) -> None:
        with pytest.raises(ValidationError, match="only mount access"):
            parse_publish("csi-abc", TARGET, context(), kubelet_dir="/var/lib/kubelet", mount_access=False)


def test_a_volumes_grant_name_is_a_valid_grant_name_of_eerl_csi() -> None:
    name = grant_name("csi-" + "f" * 64)
    assert is_grant_name(name)
    assert name.startswith("csi-")
    assert len(name) == 40
