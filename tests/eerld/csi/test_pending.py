"""Fail-open: a pod whose volume is published while eerld is away starts at once, and gets its grant later.

When eerld does not answer, NodePublishVolume still succeeds: eerl-csi makes the grant's directory itself
(where eerld puts the grant's socket, as eerld makes it), mounts it, and records the volume as pending; the
reconcile (at eerl-csi's start and every ``--reconcile-s``) asks for the grant once eerld answers, and the
socket appears in the directory already mounted into the pod. The sidecar meanwhile answers without clock
control and connects when the socket appears. Only an absent eerld is so: an unknown pod, a pod without
GPUs, bad attributes and an absent kubelet are refused as before.
"""

from __future__ import annotations

import json
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import grpc

from eerld.csi.grant import grant_name
from eerld.csi.mounts import is_mount_point
from eerld.csi.node import NodePlugin, ReconcileOutcome
from eerld.testing import DaemonHandle
from tests.eerld.csi.conftest import Listing, grant_names, holders, make_plugin, publish, uuids
from tests.eerld.csi.harness import (
    CsiPlugin,
    FakeKubelet,
    Pod,
    as_pod_user,
    csi_eerld,
    open_call,
    publish_error,
    publish_request,
    running_plugin,
    volume_context,
    volume_id,
)
from tests.sidecar.conftest import SidecarProcess, wait_until


def records(state_dir: Path) -> list[dict[str, Any]]:
    """eerl-csi's volume records, as on disk."""
    path = state_dir / "volumes.json"
    return list(json.loads(path.read_text())["volumes"]) if path.exists() else []


def _ran(outcome: ReconcileOutcome) -> ReconcileOutcome | None:
    """The outcome of a reconcile that reached eerld (its channel reconnects within a second)."""
    return None if outcome.skipped else outcome


def listed_while_eerld_is_away(kubelet: FakeKubelet, node: DaemonHandle, gpu: int) -> tuple[Pod, Path]:
    """A pod with GPU ``gpu`` that the kubelet lists, its volume's target path; eerld stopped."""
    pod = Pod("rl", "trainer-0", (uuids(node)[gpu],))
    kubelet.pods = [pod]
    target = kubelet.target_path(pod)
    node.server.stop(grace_s=0.5)
    return pod, target


class TestPublishWhileEerldIsAway:
    def test_publish_succeeds_with_an_empty_grant_directory_mounted_and_a_pending_record(
        self, csi_dir: Path, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod, target = listed_while_eerld_is_away(kubelet, node, 0)
        code = plugin.publish(publish_request(pod, target))
        directory = csi_dir / "grants" / grant_name(volume_id(pod))
        st = directory.lstat()
        assert code is grpc.StatusCode.OK
        assert is_mount_point(target)
        assert list(target.iterdir()) == []  # no socket yet: the sidecar fails open
        assert (stat.S_ISDIR(st.st_mode), st.st_uid, stat.S_IMODE(st.st_mode)) == (True, 0, 0o711)
        assert [(r["volume_id"], r["state"]) for r in records(plugin.state_dir)] == [
            (volume_id(pod), "pending")
        ]

    def test_a_restarted_eerl_csi_asks_for_the_grant_and_its_socket_appears_in_the_mount(
        self, csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod, target = listed_while_eerld_is_away(kubelet, node, 1)
        with running_plugin(csi_dir, kubelet, node.admin_socket_path) as first:
            assert first.publish(publish_request(pod, target)) is grpc.StatusCode.OK
        with (
            csi_eerld(csi_dir) as again,
            running_plugin(csi_dir, kubelet, again.admin_socket_path) as csi,
        ):
            codes = as_pod_user(target, [open_call(job_id=pod.uid)])
            held, names, state = holders(again), grant_names(again), records(csi.state_dir)
        assert codes == ["OK"]
        assert held == {1: pod.uid}
        assert names == [grant_name(volume_id(pod))]
        assert [r["state"] for r in state] == ["granted"]

    def test_refusals_stay_refusals_while_eerld_is_away(
        self, csi_dir: Path, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        gpu = uuids(node)[0]
        known, cpu_only, ghost = Pod("rl", "t", (gpu,)), Pod("rl", "cpu", ()), Pod("rl", "ghost", (gpu,))
        kubelet.pods = [known, cpu_only]
        node.server.stop(grace_s=0.5)
        outcomes = [
            publish_error(plugin, publish_request(ghost, kubelet.target_path(ghost))),
            publish_error(plugin, publish_request(cpu_only, kubelet.target_path(cpu_only))),
            publish_error(
                plugin,
                publish_request(known, kubelet.target_path(known), volume_context(known, uid="1", gpus="0")),
            ),
        ]
        kubelet.stop()
        outcomes.append(publish_error(plugin, publish_request(known, kubelet.target_path(known))))
        assert [code for code, _ in outcomes] == [
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION,
            grpc.StatusCode.INVALID_ARGUMENT,
            grpc.StatusCode.UNAVAILABLE,
        ]
        assert "pod-resources" in outcomes[3][1]
        assert not any(is_mount_point(kubelet.target_path(p)) for p in (known, cpu_only, ghost))
        assert records(plugin.state_dir) == []
        assert not (csi_dir / "grants").exists() or list((csi_dir / "grants").iterdir()) == []

    def test_unpublish_of_a_pending_volume_unmounts_and_removes_its_directory_and_record(
        self, csi_dir: Path, plugin: CsiPlugin, kubelet: FakeKubelet, node: DaemonHandle
    ) -> None:
        pod, target = listed_while_eerld_is_away(kubelet, node, 0)
        plugin.publish(publish_request(pod, target))
        code = plugin.unpublish(volume_id(pod), target)
        assert code is grpc.StatusCode.OK
        assert not target.exists()
        assert not (csi_dir / "grants" / grant_name(volume_id(pod))).exists()
        assert records(plugin.state_dir) == []


class TestTheReconcileGrantsPendingVolumes:
    def test_the_grant_is_made_by_the_first_reconcile_that_reaches_eerld(
        self, csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[2],))
        listing.pods = [pod]
        plugin: NodePlugin = make_plugin(csi_dir, kubelet, node, listing)
        try:
            node.server.stop(grace_s=0.5)
            target = publish(plugin, kubelet, pod)
            away = plugin.reconcile()
            with csi_eerld(csi_dir) as again:
                back = wait_until("a reconcile that reaches eerld", lambda: _ran(plugin.reconcile()))
                codes = as_pod_user(target, [open_call(job_id=pod.uid)])
                held = holders(again)
        finally:
            plugin.close()
        assert (bool(away.skipped), away.granted) == (True, ())
        assert back.granted == (grant_name(volume_id(pod)),)
        assert codes == ["OK"]
        assert held == {2: pod.uid}

    def test_a_pending_volume_of_a_deleted_pod_is_retired_without_a_grant(
        self, csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing
    ) -> None:
        pod = Pod("rl", "trainer-0", (uuids(node)[0],))
        listing.pods = [pod]
        plugin = make_plugin(csi_dir, kubelet, node, listing)
        try:
            node.server.stop(grace_s=0.5)
            target = publish(plugin, kubelet, pod)
            listing.pods = []
            with csi_eerld(csi_dir) as again:
                outcomes = [wait_until("a reconcile", lambda: _ran(plugin.reconcile())) for _ in range(2)]
                names = grant_names(again)
        finally:
            plugin.close()
        assert [o.granted for o in outcomes] == [(), ()]
        assert outcomes[1].revoked == (grant_name(volume_id(pod)),)
        assert names == []
        assert not is_mount_point(target)
        assert not (csi_dir / "grants" / grant_name(volume_id(pod))).exists()
        assert records(csi_dir / "state-csi") == []


class TestTheSidecar:
    def test_it_answers_without_clock_control_until_the_socket_appears_then_connects(
        self,
        csi_dir: Path,
        kubelet: FakeKubelet,
        node: DaemonHandle,
        start_sidecar: Callable[..., SidecarProcess],
    ) -> None:
        pod, target = listed_while_eerld_is_away(kubelet, node, 3)
        reconcile = ["--reconcile-s=0.5"]
        with running_plugin(csi_dir, kubelet, node.admin_socket_path, extra=reconcile) as csi:
            assert csi.publish(publish_request(pod, target)) is grpc.StatusCode.OK
            sidecar = start_sidecar(
                "--job-id",
                pod.uid,
                "--scoped",
                "--listen",
                "127.0.0.1:0",
                "--socket",
                str(target / "eerld.sock"),
            )
            away = sidecar.status()
            begin = sidecar.post("/v1/phases/begin", {"kind": "generation", "iteration": 1})
            with csi_eerld(csi_dir) as again:
                wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
                held = holders(again)
        assert away["connected"] is False
        assert (begin[0], begin[1]["connected"]) == (200, False)
        assert held == {3: pod.uid}
