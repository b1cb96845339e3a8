"""Publish, unpublish and reconcile: the CSI node's work, in plain Python over the kubelet and eerld.

- **Publish** (a pod's inline volume): check the request (:mod:`eerld.csi.volume`), list the kubelet's
  pods and take this pod's GPUs (:mod:`eerld.csi.pods`), write the volume's record, ask eerld for a grant
  of exactly those GPUs owned by the attributes' uid/gid and limited to the pod's uid as job id, and
  bind-mount the grant's directory at the target path. Any failure undoes what was done (no grant, no
  record, no mount) and is raised as one :mod:`eerld.errors` error; a second publish of a published volume
  is a no-op.
- **Unpublish**: unmount, revoke, forget; idempotent. When eerld does not answer, the volume is unmounted
  anyway (a pod's termination never waits for eerld) and its record kept, so that the reconcile revokes the
  grant once eerld is back.
- **Reconcile** (at start and every ``--reconcile-s``): revoke the grants of pods the kubelet no longer
  lists — records whose pod is gone, and ``csi-`` grants no record names — once they were seen so in two
  reconciles in a row, so that a kubelet restarting with a short list costs no live pod its grant. A
  publish also retires, at once, the records of pods missing from the very listing that shows its own pod,
  or of an older pod of the same name: the kubelet has given their GPUs to someone else.

One lock serialises the three, so that a reconcile never sees a grant whose record is being written.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import structlog

from eerld.csi import mounts
from eerld.csi.grant import GRANT_PREFIX, EerldGrants, grant_name, plan_grant
from eerld.csi.pods import PodLister, live_pods, pod_gpus
from eerld.csi.records import VolumeRecord, VolumeRecords
from eerld.csi.volume import check_target_path, parse_publish
from eerld.errors import Conflict, Unavailable
from eerld.podresources import PodDevices, PodResourcesError

log = structlog.get_logger("eerld.csi")

LIST_TIMEOUT_S = 2.0


@dataclass(frozen=True, slots=True)
class ReconcileOutcome:
    """What one reconcile did: the grants revoked, and those it will revoke next time if still orphaned."""

    revoked: tuple[str, ...]
    suspected: tuple[str, ...]
    skipped: str = ""
    """Why nothing was judged (the kubelet or eerld did not answer); empty when it ran."""


class NodePlugin:
    """The node's volumes; thread-safe."""

    def __init__(
        self,
        pods: PodLister,
        eerld: EerldGrants,
        records: VolumeRecords,
        *,
        kubelet_dir: Path,
        list_timeout_s: float = LIST_TIMEOUT_S,
    ) -> None:
        self._pods = pods
        self._eerld = eerld
        self._records = records
        self._kubelet_dir = str(kubelet_dir)
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
                self._eerld.revoke(existing.grant, "eerl-csi: published again")
            pods = self._list_pods()
            gpus = pod_gpus(pods, volume.namespace, volume.pod_name)
            live = live_pods(pods)
            for record in self._records.all().values():
                gone = (record.namespace, record.pod_name) not in live
                renamed = (record.namespace, record.pod_name) == (volume.namespace, volume.pod_name)
                if record.volume_id != volume_id and (gone or (renamed and record.pod_uid != volume.pod_uid)):
                    self._retire(record, "its pod is gone: the kubelet gave its GPUs to another pod")
            plan = plan_grant(volume, gpus)
            record = VolumeRecord(
                volume_id, plan.name, volume.namespace, volume.pod_name, volume.pod_uid, target_path
            )
            self._records.put(record)
            try:
                granted = self._eerld.grant(plan)
            except BaseException:
                self._records.remove(volume_id)
                raise
            try:
                mounts.bind_read_only(granted.socket_path.parent, target)
            except BaseException:
                self._undo(record)
                raise
        log.info(
            "published",
            pod=volume.pod,
            pod_uid=volume.pod_uid,
            volume_id=volume_id,
            grant=granted.name,
            gpus=[str(g) for g in gpus],
            gpu_indices=list(granted.gpu_indices),
            uid=volume.uid,
            gid=volume.gid,
            target_path=target_path,
        )

    def unpublish(self, volume_id: str, target_path: str) -> None:
        """Unmount, revoke the grant, forget the volume; a no-op for a volume not (or no longer) published."""
        check_target_path(target_path, self._kubelet_dir, None)
        target = Path(target_path)
        with self._lock:
            mounts.unmount(target)
            with contextlib.suppress(OSError):
                target.rmdir()
            record = self._records.get(volume_id)
            name = record.grant if record is not None else grant_name(volume_id)
            try:
                revoked = self._eerld.revoke(name, "eerl-csi: volume unpublished")
            except Unavailable as e:
                log.warning(
                    "revoke_deferred",
                    volume_id=volume_id,
                    grant=name,
                    error=str(e),
                    effect="reconcile revokes it",
                )
                return
            self._records.remove(volume_id)
        log.info("unpublished", volume_id=volume_id, grant=name, revoked=revoked)

    def reconcile(self) -> ReconcileOutcome:
        """Revoke grants of pods the kubelet stopped listing (two reconciles in a row); see the docstring."""
        with self._lock:
            try:
                live = live_pods(self._list_pods())
                grants = self._eerld.grants()
            except Unavailable as e:
                log.warning("reconcile_skipped", error=str(e))
                return ReconcileOutcome((), tuple(sorted(self._suspects)), skipped=str(e))
            records = self._records.all()
            recorded = {r.grant for r in records.values()}
            orphans: dict[str, VolumeRecord | str] = {
                r.grant: r for r in records.values() if (r.namespace, r.pod_name) not in live
            }
            orphans.update(
                {g.name: g.name for g in grants if g.name.startswith(GRANT_PREFIX) and g.name not in recorded}
            )
            due = [name for name in sorted(orphans) if name in self._suspects]
            revoked: list[str] = []
            for name in due:
                orphan = orphans[name]
                try:
                    if isinstance(orphan, VolumeRecord):
                        self._retire(orphan, "reconcile: the kubelet no longer lists its pod")
                    else:
                        self._eerld.revoke(name, "eerl-csi reconcile: no volume of this node names it")
                except Unavailable as e:
                    log.warning("reconcile_revoke_failed", grant=name, error=str(e))
                    continue
                revoked.append(name)
            self._suspects = frozenset(orphans) - set(revoked)
        if revoked:
            log.info("reconciled", revoked=revoked)
        return ReconcileOutcome(tuple(revoked), tuple(sorted(self._suspects)))

    def _list_pods(self) -> tuple[PodDevices, ...]:
        try:
            return tuple(self._pods.list_pods(self._list_timeout_s))
        except PodResourcesError as e:
            raise Unavailable(f"the kubelet's pod-resources API does not answer: {e}") from None

    def _retire(self, record: VolumeRecord, reason: str) -> None:
        """Unmount a stale volume, revoke its grant and forget it (lock held)."""
        mounts.unmount(Path(record.target_path))
        self._eerld.revoke(record.grant, f"eerl-csi: {reason}")
        self._records.remove(record.volume_id)
        log.info(
            "retired",
            volume_id=record.volume_id,
            grant=record.grant,
            pod=f"{record.namespace}/{record.pod_name}",
            reason=reason,
        )

    def _undo(self, record: VolumeRecord) -> None:
        """Take back a publish that failed after its grant (lock held); errors of the undo are logged."""
        try:
            self._eerld.revoke(record.grant, "eerl-csi: publish failed")
        except Unavailable as e:
            log.warning("undo_revoke_failed", grant=record.grant, error=str(e), effect="reconcile revokes it")
            return
        self._records.remove(record.volume_id)

    def close(self) -> None:
        """Close the kubelet's and eerld's channels."""
        self._pods.close()
        self._eerld.close()


__all__ = ["NodePlugin", "ReconcileOutcome"]
