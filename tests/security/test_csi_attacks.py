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

import json
import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.csi.grant import grant_name
from eerld.csi.mounts import is_mount_point, mount_points
from eerld.csi.records import RECORDS_FILE
from eerld.testing import DaemonHandle
from tests.conftest import short_socket_dir
from tests.eerld.csi.conftest import grant_names, holders, uuids
from tests.eerld.csi.harness import (
    POD_USER,
    CsiPlugin,
    FakeKubelet,
    Pod,
    csi_eerld,
    fake_kubelet,
    open_call,
    publish_error,
    publish_request,
    running_plugin,
    volume_context,
    volume_id,
)
from tests.security.conftest import NOBODY_UID, call, run_as
from tests.security.test_failsafes import fill, tmpfs


@pytest.fixture
def node_dir() -> Iterator[tuple[Path, DaemonHandle, FakeKubelet]]:
    """eerld (multi-tenant, 4 fake GPUs) and a fake kubelet in one short directory; no eerl-csi yet."""
    with short_socket_dir(prefix="c") as directory:
        directory.chmod(0o755)
        with csi_eerld(directory) as node, fake_kubelet(directory) as kubelet:
            yield directory, node, kubelet


@pytest.fixture
def world(
    node_dir: tuple[Path, DaemonHandle, FakeKubelet],
) -> Iterator[tuple[DaemonHandle, FakeKubelet, CsiPlugin]]:
    """eerld, a fake kubelet and eerl-csi, in one short directory."""
    directory, node, kubelet = node_dir
    with running_plugin(directory, kubelet, node.admin_socket_path) as plugin:
        yield node, kubelet, plugin


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


class TestTheTargetPath:
    def test_a_symlink_planted_at_the_target_is_never_mounted_through(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        """A symlink where the kubelet's mount point should be (to ``/etc``, say) is refused, not followed:
        nothing is mounted over what it points to, and the grant made for the volume is taken back."""
        node, kubelet, plugin = world
        pod = Pod("rl", "job", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        elsewhere = kubelet.kubelet_dir / "elsewhere"  # under the kubelet's root: unmounted at the end if hit
        elsewhere.mkdir(mode=0o755)
        target.symlink_to(elsewhere, target_is_directory=True)
        code, message = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "is not a directory (a symlink); refusing to mount on it" in message
        assert not is_mount_point(elsewhere)
        assert nothing_granted(node, target)
        assert target.is_symlink()
        assert records(plugin.state_dir) == []


COMPONENTS = ("pods", "the pod's directory", "volumes", "kubernetes.io~csi", "the volume's directory")


def redirect(kubelet: FakeKubelet, target: Path, component: int, to: Path) -> Path:
    """Replace ``component`` (0: ``pods`` … 4: the volume's directory) of the target path under the
    kubelet's root with a symlink to the same tail under ``to``; the directory the mount would land in."""
    parts = target.relative_to(kubelet.kubelet_dir).parts
    real = to.joinpath(*parts[component:-1])
    real.mkdir(parents=True, mode=0o755)
    link = kubelet.kubelet_dir.joinpath(*parts[: component + 1])
    os.rename(link, to.parent / f"moved-{component}")  # kept: a directory the test made
    link.symlink_to(to / parts[component], target_is_directory=True)
    return real / parts[-1]


def mounts_under(path: Path) -> list[Path]:
    real = Path(os.path.realpath(path))
    return [p for p in mount_points() if p == real or real in p.parents]


class TestATargetPathThroughASymlink:
    """Only root or the kubelet can plant a symlink in the kubelet's pod directories, but a mount made
    through one lands outside the pod's volume (before: wherever the link pointed). Every component of the
    target path is opened without following a symlink, from ``/``; the mount is made on the directory so
    opened (``/proc/self/fd/N``), and an unmount goes through the opened parent, never through a link."""

    @pytest.mark.parametrize("component", range(len(COMPONENTS)), ids=COMPONENTS)
    def test_a_symlink_at_any_component_refuses_the_volume_with_no_mount_grant_or_record(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin], component: int
    ) -> None:
        node, kubelet, plugin = world
        pod = Pod("rl", "job", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        elsewhere = kubelet.kubelet_dir / "elsewhere"  # under the kubelet's root: unmounted at the end if hit
        landing = redirect(kubelet, target, component, elsewhere)
        code, message = publish_error(plugin, publish_request(pod, target))
        assert code is grpc.StatusCode.FAILED_PRECONDITION
        assert "is a symlink; refusing to mount through it" in message
        assert mounts_under(elsewhere) == []
        assert not landing.exists()
        assert nothing_granted(node, target)
        assert records(plugin.state_dir) == []

    def test_an_unpublish_through_a_symlink_unmounts_nothing_it_points_to(
        self, world: tuple[DaemonHandle, FakeKubelet, CsiPlugin]
    ) -> None:
        """Pod a's ``volumes`` directory swapped for a link to pod b's: a's unpublish (the same tail, volume
        ``e``) would unmount b's socket. After: b's mount and socket stay; a's grant is revoked all the same
        (the grant, not the mount, is what serves a's GPUs)."""
        node, kubelet, plugin = world
        gpu = uuids(node)
        a, b = Pod("rl", "a", (gpu[0],)), Pod("rl", "b", (gpu[1],))
        kubelet.pods = [a, b]
        target_a, target_b = kubelet.target_path(a), kubelet.target_path(b)
        assert plugin.publish(publish_request(a, target_a)) is grpc.StatusCode.OK
        assert plugin.publish(publish_request(b, target_b)) is grpc.StatusCode.OK
        volumes_a = target_a.parents[2]
        os.rename(volumes_a, kubelet.kubelet_dir / "moved-a")
        volumes_a.symlink_to(target_b.parents[2], target_is_directory=True)
        code = plugin.unpublish(volume_id(a), target_a)
        b_mounted = is_mount_point(target_b)
        b_serves = run_as(
            f"unix:{target_b / 'eerld.sock'}", [open_call(job_id=b.uid)], uid=POD_USER, gid=POD_USER
        )[0]
        assert code is grpc.StatusCode.OK
        assert b_mounted
        assert b_serves.code == "OK"
        assert grant_names(node) == [grant_name(volume_id(b))]


def records(state_dir: Path) -> list[dict[str, Any]]:
    """eerl-csi's volume records, as on disk."""
    path = state_dir / RECORDS_FILE
    return list(json.loads(path.read_text())["volumes"]) if path.exists() else []


CORRUPT_RECORDS = ("not json", "a list of garbage", "a symlink", "a directory", "another owner", "mode 0666")


def corrupt(state_dir: Path, kind: str) -> Path:
    """Make ``state_dir`` (0700) with a records file eerl-csi did not write; a file a symlink there points
    to, which must never be written through."""
    state_dir.mkdir(mode=0o700)
    outside = state_dir.parent / "outside.json"
    outside.write_text('{"version": 1, "volumes": []}')
    path = state_dir / RECORDS_FILE
    if kind == "not json":
        path.write_text("{not json")
    elif kind == "a list of garbage":
        path.write_text(json.dumps({"version": 1, "volumes": [{"volume_id": 7}]}))
    elif kind == "a symlink":
        path.symlink_to(outside)
    elif kind in ("another owner", "mode 0666"):  # well-formed, but not a file only root could write
        path.write_text('{"version": 1, "volumes": []}')
        if kind == "another owner":
            os.chown(path, NOBODY_UID, NOBODY_UID)
        else:
            path.chmod(0o666)
    else:
        path.mkdir()
    return outside


class TestTheRecordsFile:
    """The records under --state-dir (root only) are what a restarted eerl-csi trusts: one it did not write
    is set aside whole (kept, never written over, never written through), one it cannot write is a clear
    error that changes nothing."""

    @pytest.mark.parametrize("kind", CORRUPT_RECORDS)
    def test_a_records_file_eerl_csi_did_not_write_is_set_aside_and_kept(
        self, node_dir: tuple[Path, DaemonHandle, FakeKubelet], kind: str
    ) -> None:
        directory, node, kubelet = node_dir
        state_dir = directory / "state-csi"
        outside = corrupt(state_dir, kind)
        before = {p.name: p.lstat().st_ino for p in state_dir.iterdir()}
        pod = Pod("rl", "job", (uuids(node)[0],))
        kubelet.pods = [pod]
        target = kubelet.target_path(pod)
        with running_plugin(directory, kubelet, node.admin_socket_path) as plugin:
            code = plugin.publish(publish_request(pod, target))
            log = plugin.log_path.read_text(errors="replace")
        set_aside = [p for p in state_dir.iterdir() if p.name.startswith(f"{RECORDS_FILE}.corrupt-")]
        assert code is grpc.StatusCode.OK
        assert [p.lstat().st_ino for p in set_aside] == [before[RECORDS_FILE]]
        assert "volume_records_set_aside" in log
        assert [r["volume_id"] for r in records(state_dir)] == [volume_id(pod)]
        assert not (state_dir / RECORDS_FILE).is_symlink()
        assert outside.read_text() == '{"version": 1, "volumes": []}'

    def test_a_state_directory_others_may_write_stops_eerl_csi_with_one_error_line(
        self, node_dir: tuple[Path, DaemonHandle, FakeKubelet]
    ) -> None:
        directory, node, kubelet = node_dir
        state_dir = directory / "state-csi"
        state_dir.mkdir()
        state_dir.chmod(0o777)
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "eerld.csi.main",
                f"--csi-socket={directory / 'csi' / 'csi.sock'}",
                "--node-id=node-a",
                f"--admin-socket={node.admin_socket_path}",
                f"--pod-resources-socket={kubelet.socket_path}",
                f"--kubelet-dir={kubelet.kubelet_dir}",
                f"--state-dir={state_dir}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert done.stderr.splitlines()[-1].startswith(
            f"Error: --state-dir: {state_dir} is writable by group"
        )
        assert list(state_dir.iterdir()) == []

    def test_a_full_disk_refuses_the_publish_clearly_loses_no_record_and_passes_once_space_returns(
        self, node_dir: tuple[Path, DaemonHandle, FakeKubelet]
    ) -> None:
        directory, node, kubelet = node_dir
        gpu = uuids(node)
        first, second = Pod("rl", "first", (gpu[0],)), Pod("rl", "second", (gpu[1],))
        kubelet.pods = [first, second]
        targets = [kubelet.target_path(p) for p in (first, second)]
        with (
            tmpfs(directory / "state-csi") as state_dir,
            running_plugin(directory, kubelet, node.admin_socket_path) as plugin,
        ):
            assert plugin.publish(publish_request(first, targets[0])) is grpc.StatusCode.OK
            filler = fill(state_dir)
            code, message = publish_error(plugin, publish_request(second, targets[1]))
            on_full_disk = (
                [r["volume_id"] for r in records(state_dir)],
                sorted(p.name for p in state_dir.iterdir()),
                grant_names(node),
                is_mount_point(targets[1]),
            )
            filler.unlink()
            again = plugin.publish(publish_request(second, targets[1]))
            after = records(state_dir)
        assert code is grpc.StatusCode.UNAVAILABLE
        assert message == (f"cannot record the volume in {state_dir / RECORDS_FILE}: No space left on device")
        assert on_full_disk == (
            [volume_id(first)],
            ["filler", RECORDS_FILE],
            [grant_name(volume_id(first))],
            False,
        )
        assert again is grpc.StatusCode.OK
        assert sorted(r["volume_id"] for r in after) == sorted([volume_id(first), volume_id(second)])
