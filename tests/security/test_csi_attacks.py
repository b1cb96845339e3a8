"""eerl-csi attacked: what a pod author writes in ``volumeAttributes`` decides who in the pod may connect,
never which GPUs it gets; a request without the kubelet's pod information is refused; the plugin's socket,
which makes grants with eerld's admin authority, admits root only; a grant's own directory that someone
else made (a symlink, other files, another owner or mode) is used neither by eerld nor by eerl-csi.

The pod author's attacks reach the plugin through the kubelet, which forwards the volume's attributes (and
adds the pod's identity over them), so they are made here as the kubelet makes its calls, as root on the
plugin's socket; the attacks of a local user (the plugin's socket) and of the pod's own processes (its
grant socket) are made by unprivileged processes (``run_as``). Every refusal leaves no grant and no mount.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.csi.grant import grant_name
from eerld.csi.mounts import is_mount_point
from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon
from tests.conftest import short_socket_dir
from tests.csi.conftest import grant_names, holders, uuids
from tests.csi.harness import (
    POD_USER,
    CsiPlugin,
    FakeKubelet,
    Pod,
    fake_kubelet,
    publish_error,
    publish_request,
    running_plugin,
    volume_context,
    volume_id,
)
from tests.security.conftest import NOBODY_UID, call, run_as


@pytest.fixture
def world() -> Iterator[tuple[DaemonHandle, FakeKubelet, CsiPlugin]]:
    """eerld (multi-tenant, 4 fake GPUs), a fake kubelet and eerl-csi, in one short directory."""
    with short_socket_dir(prefix="c") as directory:
        directory.chmod(0o755)
        with (
            running_daemon(directory, backend=FakeGpuBackend(4), reaper=False, tenancy="multi") as node,
            fake_kubelet(directory) as kubelet,
            running_plugin(directory, kubelet, node.admin_socket_path) as plugin,
        ):
            yield node, kubelet, plugin


def open_call(*gpus: int, job_id: str) -> dict:
    return call("PhaseService", "OpenSession", {"jobId": job_id, "gpus": [{"index": i} for i in gpus]})


def nothing_granted(node: DaemonHandle, target: Path) -> bool:
    return grant_names(node) == [] and not is_mount_point(target)


class TestThePodAuthor:
    def test_attributes_that_name_gpus_are_refused(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        node, kubelet, plugin = world
        attacker = Pod("mallory", "job", (uuids(node)[3],))
        kubelet.pods = [attacker]
        target = kubelet.target_path(attacker)
        refusals = [
            publish_error(
                plugin, publish_request(attacker, target, volume_context(attacker, uid="1000", **extra))
            )
            for extra in ({"gpus": "0,1"}, {"gpu": "GPU-fake-0000-0000-0000-000000000000"}, {"job_id": "x"})
        ]
        assert [code for code, _ in refusals] == [grpc.StatusCode.INVALID_ARGUMENT] * 3
        assert "volumeAttributes take uid and gid only" in refusals[0][1]
        assert nothing_granted(node, target)

    def test_a_request_for_another_pod_at_the_authors_path_is_refused(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        """Were the kubelet to forward an author's ``csi.storage.k8s.io/pod.*`` (podInfoOnMount off), the
        target path, which the kubelet makes from the real pod's uid, still ties the volume to its pod."""
        node, kubelet, plugin = world
        gpu = uuids(node)
        victim, attacker = Pod("prod", "trainer", (gpu[0], gpu[1])), Pod("mallory", "job", (gpu[3],))
        kubelet.pods = [victim, attacker]
        target = kubelet.target_path(attacker)
        code, message = publish_error(
            plugin, publish_request(attacker, target, volume_context(victim, uid="1000"))
        )
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert f"is not a volume of pod uid {victim.uid}" in message
        assert nothing_granted(node, target)

    def test_a_context_without_the_kubelets_pod_information_is_refused(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        node, kubelet, plugin = world
        pod = Pod("rl", "job", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        full = volume_context(pod, uid="1000")
        contexts = [
            {"uid": "1000"},  # podInfoOnMount off: nothing but the author's attributes
            {k: v for k, v in full.items() if k != "csi.storage.k8s.io/pod.uid"},
            {k: v for k, v in full.items() if k != "csi.storage.k8s.io/ephemeral"},  # a persistent volume
        ]
        refusals = [publish_error(plugin, publish_request(pod, target, c)) for c in contexts]
        assert [code for code, _ in refusals] == [grpc.StatusCode.INVALID_ARGUMENT] * 3
        assert "the pod is unknown (the CSIDriver csi.eerl.dev needs podInfoOnMount: true)" in refusals[0][1]
        assert "not an inline ephemeral volume" in refusals[2][1]
        assert nothing_granted(node, target)


class TestThePodsProcesses:
    def test_a_pods_socket_claims_none_of_another_pods_gpus_nor_its_job(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        node, kubelet, plugin = world
        gpu = uuids(node)
        victim, attacker = Pod("prod", "trainer", (gpu[0], gpu[1])), Pod("mallory", "job", (gpu[3],))
        kubelet.pods = [victim, attacker]
        victim_target, attacker_target = kubelet.target_path(victim), kubelet.target_path(attacker)
        assert plugin.publish(publish_request(victim, victim_target)) is grpc.StatusCode.OK
        assert plugin.publish(publish_request(attacker, attacker_target)) is grpc.StatusCode.OK
        victim_codes = run_as(
            f"unix:{victim_target / 'eerld.sock'}", [open_call(job_id=victim.uid)], uid=POD_USER, gid=POD_USER
        )
        attacks = run_as(
            f"unix:{attacker_target / 'eerld.sock'}",
            [
                open_call(0, job_id=attacker.uid),
                open_call(2, job_id=attacker.uid),
                open_call(job_id=victim.uid),
            ],
            uid=POD_USER,
            gid=POD_USER,
        )
        assert victim_codes[0].code == "OK"
        assert [a.code for a in attacks] == ["PERMISSION_DENIED"] * 3
        assert "GPU 0 is not granted to this socket" in attacks[0].details
        assert holders(node) == {0: victim.uid, 1: victim.uid}


class TestThePluginsSocket:
    def test_it_is_root_only_and_refuses_every_other_user(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        node, kubelet, plugin = world
        pod = Pod("rl", "job", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        socket_stat, dir_stat = plugin.socket_path.stat(), plugin.socket_path.parent.stat()
        publish = publish_request(pod, target)
        request = {
            "volumeId": publish.volume_id,
            "targetPath": publish.target_path,
            "volumeCapability": {"mount": {}},
            "volumeContext": dict(publish.volume_context),
        }
        calls = [call("Identity", "GetPluginInfo"), call("Node", "NodePublishVolume", request)]
        outcomes = {
            uid: [o.code for o in run_as(f"unix:{plugin.socket_path}", calls, uid=uid, gid=uid)]
            for uid in (NOBODY_UID, POD_USER)
        }
        assert outcomes == {NOBODY_UID: ["UNAVAILABLE"] * 2, POD_USER: ["UNAVAILABLE"] * 2}
        assert (socket_stat.st_uid, stat.S_IMODE(socket_stat.st_mode)) == (0, 0o600)
        assert (dir_stat.st_uid, stat.S_IMODE(dir_stat.st_mode)) == (0, 0o700)
        assert nothing_granted(node, target)


def plant(node: DaemonHandle, name: str, kind: str) -> Path:
    """Something at grant ``name``'s own directory that neither eerld nor eerl-csi made; the directory
    ``elsewhere`` (empty) that a symlink there points to, where no socket may appear."""
    grant_dir = node.server.config.grant_dir
    assert grant_dir is not None
    elsewhere = grant_dir.parent / "elsewhere"
    elsewhere.mkdir(mode=0o711)
    grant_dir.mkdir(mode=0o711, exist_ok=True)
    directory = grant_dir / name
    if kind == "symlink":
        directory.symlink_to(elsewhere, target_is_directory=True)
        return elsewhere
    directory.mkdir(mode=0o711)
    if kind == "other files":
        (directory / "planted").write_text("x")
    elif kind == "another owner":
        os.chown(directory, NOBODY_UID, NOBODY_UID)
    elif kind == "a wider mode":
        directory.chmod(0o777)
    return elsewhere


PLANTS = ("symlink", "other files", "another owner", "a wider mode")


class TestTheGrantsOwnDirectory:
    """A grant's directory that exists already is used only if it is what eerl-csi makes for a pending
    volume (empty, root's, 0711 at most): anything else would let its maker steer the socket or the mount."""

    @pytest.mark.parametrize("kind", PLANTS)
    def test_eerld_refuses_a_grant_whose_directory_it_did_not_make(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin], kind: str
    ) -> None:
        node, _, _ = world
        elsewhere = plant(node, "csi-planted", kind)
        request = pb.GrantRequest(
            name="csi-planted", gpus=[pb.GpuRef(index=0)], uid=POD_USER, own_directory=True
        )
        with (
            grpc.insecure_channel(f"unix:{node.admin_socket_path}") as channel,
            pytest.raises(grpc.RpcError) as refused,
        ):
            pb_grpc.AdminServiceStub(channel).Grant(request, timeout=10)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "grant_dir" in (refused.value.details() or "")
        assert grant_names(node) == []
        assert list(elsewhere.iterdir()) == []

    @pytest.mark.parametrize("kind", PLANTS)
    def test_eerl_csi_mounts_no_directory_it_did_not_make_while_eerld_is_away(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin], kind: str
    ) -> None:
        node, kubelet, plugin = world
        pod = Pod("rl", "job", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        elsewhere = plant(node, grant_name(volume_id(pod)), kind)
        node.server.stop(grace_s=0.5)
        code, message = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "--grant-dir" in message
        assert not is_mount_point(target)
        assert list(elsewhere.iterdir()) == []
        assert '"volumes": []' in (plugin.state_dir / "volumes.json").read_text()
