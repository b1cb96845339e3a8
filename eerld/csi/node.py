"""Publish, unpublish and reconcile: the CSI node's work, in plain Python over the kubelet and eerld.

- **Publish** (a pod's inline volume): check the request (:mod:`eerld.csi.volume`), list the kubelet's
  pods and take this pod's GPUs (:mod:`eerld.csi.pods`), write the volume's record, ask eerld for a grant
  of exactly those GPUs owned by the attributes' uid/gid and limited to the pod's uid as job id, and
  bind-mount the grant's directory at the target path. Any failure undoes what was done (no grant, no
  record, no mount) and is raised as one :mod:`eerld.errors` error; a second publish of a published volume
  is a no-op.
- **Fail-open**: when eerld does not answer (and only then: an unknown pod, a pod without GPUs, bad
  attributes or an absent kubelet are refused), publish succeeds all the same, so that the pod starts
  without clock control rather than wait: eerl-csi makes the grant's directory itself, where and as eerld
  makes it (``<grant dir>/<name>``, root's, 0711), mounts it, and records the volume ``pending``; the
  reconcile asks for the grant once eerld answers, and eerld binds the socket in that directory, which the
  pod already sees.
- **Unpublish**: unmount, revoke, forget; idempotent. When eerld does not answer, the volume is unmounted
  anyway (a pod's termination never waits for eerld) and its record kept, so that the reconcile revokes the
  grant once eerld is back; a pending volume's record and directory go at once (it has no grant; one made
  unseen is a ``csi-`` grant no record names, which the reconcile revokes).
- **Reconcile** (at start and every ``--reconcile-s``): revoke the grants of pods the kubelet no longer
  lists — records whose pod is gone, and ``csi-`` grants no record names — once they were seen so in two
  reconciles in a row, so that a kubelet restarting with a short list costs no live pod its grant; revoke
  the ``retiring`` ones at once; ask for the grants of pending volumes whose pod runs. A publish also
  retires, at once, the records of pods missing from the very listing that shows its own pod, or of an
  older pod of the same name: the kubelet has given their GPUs to someone else.

One lock serialises the three, so that a reconcile never sees a grant whose record is being written.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import structlog

from eerld import files
from eerld.csi import mounts
from eerld.csi.grant import GRANT_PREFIX, EerldGrants, GrantedSocket, GrantPlan, grant_name, plan_grant
from eerld.csi.pods import GpuRef, PodLister, live_pods, pod_gpus
from eerld.csi.records import VolumeRecord, VolumeRecords, VolumeState
from eerld.csi.volume import PodVolume, check_target_path, parse_publish
from eerld.errors import ConfigError, Conflict, DaemonError, Unavailable
from eerld.grants import GRANT_DIR_MODE, OWN_DIRECTORY_SOCKET
from eerld.pods.owners import PodDevices, PodResourcesError

log = structlog.get_logger("eerld.csi")

LIST_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class ReconcileOutcome:
    """What one reconcile did: the grants revoked, and those it will revoke next time if still orphaned."""

    revoked: tuple[str, ...]
    suspected: tuple[str, ...]
    skipped: str = ""
    """Why nothing was judged (the kubelet or eerld did not answer); empty when it ran."""
    granted: tuple[str, ...] = ()
    """The grants of pending volumes made by this reconcile."""


class NodePlugin:
    """The node's volumes; thread-safe."""

    def __init__(
        self,
        pods: PodLister,
        eerld: EerldGrants,
        records: VolumeRecords,
        *,
        kubelet_dir: Path,
        grant_dir: Path,
        list_timeout_s: float = LIST_TIMEOUT_S,
    ) -> None:
        self._pods = pods
        self._eerld = eerld
        self._records = records
        self._kubelet_dir = str(kubelet_dir)
        self._grant_dir = grant_dir
        self._list_timeout_s = list_timeout_s
        self._lock = threading.Lock()
        self._suspects: frozenset[str] = frozenset()

    def publish(
        self, volume_id: str, target_path: str, context: Mapping[str, str], *, mount_access: bool
    ) -> None:
        """Give the pod of this volume its grant socket at ``target_path`` (see the module's docstring)."""
        volume = parse_publish(
            volume_id, target_path, context, kubelet_dir=self._kubelet_dir, mount_access=mount_access
        )
        target = Path(target_path)
        with self._lock:
            existing = self._records.get(volume_id)
            if existing is not None and existing.target_path != target_path:
                raise Conflict(f"volume {volume_id} is already published at {existing.target_path}")
            if existing is not None and existing.pod_uid == volume.pod_uid and mounts.is_mount_point(target):
                return
            if existing is not None:  # a publish that did not finish (a crash between grant and mount)
                with contextlib.suppress(Unavailable):  # else the pending grant's reconcile revokes it
                    self._eerld.revoke(existing.grant, "eerl-csi: published again")
            # the mount point first, walked without following a symlink: one anywhere on the path refuses
            # the volume before any record or grant, and the mount goes on the very directory walked to
            with mounts.mount_point(target) as point:
                granted, plan, gpus = self._grant_and_mount(volume, point)
        log.info(
            "published",
            pod=volume.pod,
            pod_uid=volume.pod_uid,
            volume_id=volume_id,
            grant=plan.name,
            pending=granted is None,
            gpus=[str(g) for g in gpus],
            gpu_indices=list(granted.gpu_indices) if granted is not None else None,
            uid=volume.uid,
            gid=volume.gid,
            target_path=target_path,
        )

    def _grant_and_mount(
        self, volume: PodVolume, point: mounts.MountPoint
    ) -> tuple[GrantedSocket | None, GrantPlan, tuple[GpuRef, ...]]:
        """Record, grant and mount a checked volume on its walked mount point (lock held): the grant (None
        while eerld is away), its plan and the pod's GPUs. A failure undoes what was done."""
        volume_id = volume.volume_id
        pods = self._list_pods()
        gpus = pod_gpus(pods, volume.namespace, volume.pod_name)
        live = live_pods(pods)
        for record in self._records.all().values():
            gone = (record.namespace, record.pod_name) not in live
            renamed = (record.namespace, record.pod_name) == (volume.namespace, volume.pod_name)
            if record.volume_id != volume_id and (gone or (renamed and record.pod_uid != volume.pod_uid)):
                self._retire(record, "its pod is gone: the kubelet gave its GPUs to another pod")
        plan = plan_grant(volume, gpus)
        record = _record(volume, plan.name, VolumeState.PENDING)
        self._records.put(record)
        granted: GrantedSocket | None = None
        try:
            try:
                granted = self._eerld.grant(plan)
                source = granted.socket_path.parent
            except Unavailable as e:  # fail open: the pod starts now, the reconcile gets the grant
                log.warning("grant_pending", volume_id=volume_id, grant=plan.name, error=str(e))
                source = self._own_directory(plan.name)
        except BaseException:  # no grant and no directory: nothing to mount, the record goes
            self._forget(record)
            raise
        try:
            mounts.bind_read_only(source, point)
        except BaseException:
            self._undo(record, granted=granted is not None)
            raise
        if granted is not None:
            self._records.put(replace(record, state=VolumeState.GRANTED))
            self._check_directory(granted)
        return granted, plan, gpus

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount, revoke the grant, forget the volume; a no-op for a volume not (or no longer) published."""
        check_target_path(target_path, self._kubelet_dir, None)
        target = Path(target_path)
        with self._lock:
            mounts.unmount(target)
            mounts.remove_mount_point(target)
            record = self._records.get(volume_id)
            name = record.grant if record is not None else grant_name(volume_id)
            try:
                revoked = self._eerld.revoke(name, "eerl-csi: volume unpublished")
            except Unavailable as e:
                if record is None or record.state is not VolumeState.PENDING:
                    log.warning(
                        "revoke_deferred",
                        volume_id=volume_id,
                        grant=name,
                        error=str(e),
                        effect="reconcile revokes it",
                    )
                    return
                revoked = False  # no grant (one made unseen has no record now: the reconcile revokes it)
            self._remove_own_directory(name)
            self._records.remove(volume_id)
        log.info("unpublished", volume_id=volume_id, grant=name, revoked=revoked)

    def reconcile(self) -> ReconcileOutcome:
        """Revoke grants of pods the kubelet stopped listing (two reconciles in a row); see the docstring."""
        with self._lock:
            try:
                pods = self._list_pods()
                live = live_pods(pods)
                grants = self._eerld.grants()
            except Unavailable as e:
                log.warning("reconcile_skipped", error=str(e))
                return ReconcileOutcome((), tuple(sorted(self._suspects)), skipped=str(e))
            records = self._records.all()
            revoked: list[str] = []
            for record in records.values():
                if record.state is VolumeState.RETIRING and self._retire(record, "its pod is gone"):
                    revoked.append(record.grant)
            records = self._records.all()
            recorded = {r.grant for r in records.values()}
            orphans: dict[str, VolumeRecord | str] = {
                r.grant: r for r in records.values() if (r.namespace, r.pod_name) not in live
            }
            orphans.update(
                {g.name: g.name for g in grants if g.name.startswith(GRANT_PREFIX) and g.name not in recorded}
            )
            due = [name for name in sorted(orphans) if name in self._suspects]
            for name in due:
                orphan = orphans[name]
                try:
                    if isinstance(orphan, VolumeRecord):
                        if not self._retire(orphan, "reconcile: the kubelet no longer lists its pod"):
                            continue
                    else:
                        self._eerld.revoke(name, "eerl-csi reconcile: no volume of this node names it")
                except Unavailable as e:
                    log.warning("reconcile_revoke_failed", grant=name, error=str(e))
                    continue
                revoked.append(name)
            self._suspects = frozenset(orphans) - set(revoked)
            granted = [
                record.grant
                for record in self._records.all().values()
                if record.state is VolumeState.PENDING
                and (record.namespace, record.pod_name) in live
                and self._grant_pending(record, pods, grants)
            ]
            outcome = ReconcileOutcome(tuple(revoked), tuple(sorted(self._suspects)), granted=tuple(granted))
        if revoked or granted:
            log.info("reconciled", revoked=revoked, granted=granted)
        return outcome

    def _grant_pending(
        self, record: VolumeRecord, pods: Sequence[PodDevices], grants: Sequence[GrantedSocket]
    ) -> bool:
        """Ask for a pending volume's grant (lock held); False, logged, when it is not made this time."""
        try:
            made = next((g for g in grants if g.name == record.grant), None)
            if made is None or made.job_id != record.pod_uid:
                if made is not None:  # of an earlier publish of this volume: not this pod's
                    self._eerld.revoke(record.grant, "eerl-csi: replaced by its volume's pending grant")
                assert record.uid is not None  # a pending record always has one (records.py)
                volume = PodVolume(
                    record.volume_id,
                    record.target_path,
                    record.namespace,
                    record.pod_name,
                    record.pod_uid,
                    record.uid,
                    record.gid,
                )
                made = self._eerld.grant(
                    plan_grant(volume, pod_gpus(pods, record.namespace, record.pod_name))
                )
            self._records.put(replace(record, state=VolumeState.GRANTED))
        except DaemonError as e:
            log.warning(
                "pending_grant_failed", grant=record.grant, error=str(e), effect="next reconcile retries"
            )
            return False
        self._check_directory(made)
        log.info("pending_granted", volume_id=record.volume_id, grant=record.grant, pod_uid=record.pod_uid)
        return True

    def _list_pods(self) -> tuple[PodDevices, ...]:
        try:
            return tuple(self._pods.list_pods(self._list_timeout_s))
        except PodResourcesError as e:
            raise Unavailable(f"the kubelet's pod-resources API does not answer: {e}") from None

    def _retire(self, record: VolumeRecord, reason: str) -> bool:
        """Unmount a stale volume, revoke its grant and forget it (lock held); when eerld does not answer,
        mark it ``retiring`` (the reconcile revokes it) and return False."""
        mounts.unmount(Path(record.target_path))
        try:
            self._eerld.revoke(record.grant, f"eerl-csi: {reason}")
        except Unavailable as e:
            if record.state is not VolumeState.RETIRING:
                self._records.put(replace(record, state=VolumeState.RETIRING))
            log.warning("retire_deferred", grant=record.grant, error=str(e), effect="reconcile revokes it")
            return False
        self._remove_own_directory(record.grant)
        self._records.remove(record.volume_id)
        log.info(
            "retired",
            volume_id=record.volume_id,
            grant=record.grant,
            pod=f"{record.namespace}/{record.pod_name}",
            reason=reason,
        )
        return True

    def _undo(self, record: VolumeRecord, *, granted: bool) -> None:
        """Take back a publish that failed after its grant or its own directory (lock held); errors of the
        undo are logged."""
        if granted:
            try:
                self._eerld.revoke(record.grant, "eerl-csi: publish failed")
            except Unavailable as e:
                log.warning(
                    "undo_revoke_failed", grant=record.grant, error=str(e), effect="reconcile revokes it"
                )
                return
        self._remove_own_directory(record.grant)
        self._forget(record)

    def _forget(self, record: VolumeRecord) -> None:
        """Remove the record of a publish that failed (lock held); a record that cannot be removed (a full
        disk) is logged and stays pending, which the next publish or the reconcile sees to."""
        try:
            self._records.remove(record.volume_id)
        except Unavailable as e:
            log.warning("undo_forget_failed", volume_id=record.volume_id, error=str(e))

    def _own_directory(self, name: str) -> Path:
        """The grant's directory, made as eerld makes it (root's, 0711) for a volume published while eerld
        is away; ConfigError for anything there that eerl-csi would not make (eerld refuses it too)."""
        directory = self._grant_dir / name
        try:
            files.ensure_narrow_dir(self._grant_dir, "--grant-dir", GRANT_DIR_MODE)
            files.ensure_own_socket_dir(directory, "--grant-dir", GRANT_DIR_MODE, OWN_DIRECTORY_SOCKET)
        except OSError as e:
            raise ConfigError(f"--grant-dir: cannot make {directory}: {e.strerror}") from None
        return directory

    def _remove_own_directory(self, name: str) -> None:
        """Remove the grant's directory if empty (eerld removes its own; this is one eerl-csi made)."""
        with contextlib.suppress(OSError):
            (self._grant_dir / name).rmdir()

    def _check_directory(self, granted: GrantedSocket) -> None:
        """Log a grant whose socket is not where a pending volume's directory is made (--grant-dir wrong)."""
        if granted.socket_path.parent != self._grant_dir / granted.name:
            log.error(
                "grant_dir_mismatch",
                grant=granted.name,
                socket=str(granted.socket_path),
                grant_dir=str(self._grant_dir),
                effect="volumes published while eerld is away never see their socket: fix --grant-dir",
            )

    def close(self) -> None:
        """Close the kubelet's and eerld's channels."""
        self._pods.close()
        self._eerld.close()


def _record(volume: PodVolume, grant: str, state: VolumeState) -> VolumeRecord:
    return VolumeRecord(
        volume.volume_id,
        grant,
        volume.namespace,
        volume.pod_name,
        volume.pod_uid,
        volume.target_path,
        volume.uid,
        volume.gid,
        state,
    )


__all__ = ["NodePlugin", "ReconcileOutcome"]
