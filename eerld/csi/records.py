"""What eerl-csi has published, on disk: so that a restarted eerl-csi knows each grant's pod.

A record is written (``pending``) before its grant is asked for and removed after the grant is revoked, so
every grant of eerl-csi's (named ``csi-…``) that outlives a crash has a record naming its pod, and the
reconcile (:meth:`eerld.csi.node.NodePlugin.reconcile`) can revoke those of pods the kubelet no longer runs.
A volume published while eerld was away stays ``pending`` until the reconcile gets its grant (the record
keeps the socket's uid and gid for that); one whose revoke eerld did not answer is ``retiring``.
One JSON file in a root-only state directory, replaced atomically (:func:`eerld.files.atomic_write_json`);
a write that fails (a full disk) is Unavailable and changes nothing. A file that is not what eerl-csi wrote
(not JSON of the records' form, a symlink, a file of another owner or one group or others may write) is set
aside, kept as ``volumes.json.corrupt-<time>`` (its grants then count as unrecorded, see the node);
one that cannot be set aside stops eerl-csi from starting (OSError), so that it is never written over.
"""

from __future__ import annotations

import enum
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

import structlog

from eerld.errors import ConfigError, Unavailable
from eerld.files import atomic_write_json, ensure_private_dir, read_json_object, set_aside

log = structlog.get_logger("eerld.csi.records")

RECORDS_FILE = "volumes.json"


class VolumeState(enum.StrEnum):
    """Where a volume's grant stands."""

    PENDING = "pending"
    """Not (known to be) made: being published, or published while eerld was away (the reconcile asks)."""
    GRANTED = "granted"
    RETIRING = "retiring"
    """Its pod is gone, its volume unmounted; eerld did not answer the revoke (the reconcile repeats it)."""


@dataclass(frozen=True, slots=True)
class VolumeRecord:
    """One published (or being published) volume."""

    volume_id: str
    grant: str
    namespace: str
    pod_name: str
    pod_uid: str
    target_path: str
    uid: int | None = None
    """The socket's owner and group (the volume's attributes); None only in records of eerl-csi 0.1.0."""
    gid: int | None = None
    state: VolumeState = VolumeState.GRANTED


class VolumeRecords:
    """The records under ``state_dir``; every change written before it is relied on (memory follows the
    file: a change that cannot be written is not made)."""

    def __init__(self, state_dir: Path) -> None:
        ensure_private_dir(state_dir, "--state-dir")
        self._path = state_dir / RECORDS_FILE
        self._lock = threading.Lock()
        self._records = self._load()

    def _load(self) -> dict[str, VolumeRecord]:
        try:
            items = read_json_object(self._path, private=True).get("volumes", [])
            if not isinstance(items, list):
                raise ConfigError(f"{self._path}: 'volumes' must be a list")
            records = [_record(item, self._path) for item in items]
        except ConfigError as e:
            moved = set_aside(self._path)
            log.error("volume_records_set_aside", error=str(e), moved_to=str(moved))
            return {}
        return {r.volume_id: r for r in records}

    def all(self) -> Mapping[str, VolumeRecord]:
        """A copy of every record, by volume id."""
        with self._lock:
            return dict(self._records)

    def get(self, volume_id: str) -> VolumeRecord | None:
        """The record of ``volume_id``, if any."""
        with self._lock:
            return self._records.get(volume_id)

    def put(self, record: VolumeRecord) -> None:
        """Add or replace a record, durably."""
        with self._lock:
            records = {**self._records, record.volume_id: record}
            self._write(records)
            self._records = records

    def remove(self, volume_id: str) -> None:
        """Remove a record, durably (a no-op when there is none)."""
        with self._lock:
            if volume_id in self._records:
                records = {k: v for k, v in self._records.items() if k != volume_id}
                self._write(records)
                self._records = records

    def _write(self, records: Mapping[str, VolumeRecord]) -> None:
        """Replace the file; Unavailable (the file and the records in memory unchanged) when it cannot be
        written (a full disk): the kubelet retries the call that needed it."""
        try:
            atomic_write_json(self._path, {"version": 1, "volumes": [asdict(r) for r in records.values()]})
        except OSError as e:
            raise Unavailable(f"cannot record the volume in {self._path}: {e.strerror or e}") from None


_TEXT_FIELDS = ("volume_id", "grant", "namespace", "pod_name", "pod_uid", "target_path")
_IDS = ("uid", "gid")


def _record(item: object, path: Path) -> VolumeRecord:
    """One stored record, every field type-checked; uid, gid and state may be absent (eerl-csi 0.1.0)."""
    if (
        not isinstance(item, dict)
        or not set(_TEXT_FIELDS) <= set(item) <= {*_TEXT_FIELDS, *_IDS, "state"}
        or not all(isinstance(item[k], str) for k in _TEXT_FIELDS)
        or not all(item.get(k) is None or type(item[k]) is int for k in _IDS)
        or item.get("state", VolumeState.GRANTED) not in set(VolumeState)
        or (item.get("state") == VolumeState.PENDING and item.get("uid") is None)
    ):
        raise ConfigError(f"{path}: malformed volume record {str(item)[:200]}")
    return VolumeRecord(**{**item, "state": VolumeState(item.get("state", VolumeState.GRANTED))})


__all__ = ["RECORDS_FILE", "VolumeRecord", "VolumeRecords", "VolumeState"]
