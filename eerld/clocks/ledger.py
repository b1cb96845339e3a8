"""The lock ledger: a crash-safe record of every GPU that eerld may have left locked.

A GPU is written to the ledger *before* its clock is locked and removed only *after* it was reset, so
whatever way the daemon dies (SIGKILL, OOM, power cut of the host process), the next start knows which
GPUs to reset. Writes are atomic (:func:`eerld.files.atomic_write_bytes`: temp file, fsync, rename, fsync of
the directory; mode 0600, in a state directory only root may change, checked when the ledger is opened).

The record on disk is the truth, and memory follows it: :meth:`Ledger.add` writes first and lists the GPU
only once the write is durable (a failed write, such as a full disk, raises OSError and lists nothing, so a
retry writes again instead of finding the GPU "already listed"); :meth:`Ledger.remove` that cannot write
keeps the GPU listed (the safe direction) and retries the removal with the next write or
:meth:`Ledger.retry_removals`.

The arbiter unlists a GPU when no session holds it any more, not at the end of each phase: a job's GPU
stays listed between its phases, so a job's phase changes write nothing and take no lock here (a crash in
between leaves a reset GPU listed, which the next start resets again: harmless).

A ledger that cannot be read (not JSON, wrong types, unreadable) says nothing about which GPUs are locked.
It is opened anyway (so the daemon can start), marked :attr:`Ledger.corrupt`; :meth:`Ledger.entries` and
every change refuse it with ConfigError until the caller has reset every GPU and called
:meth:`Ledger.set_aside`, which renames the file to ``ledger.json.corrupt-<unix time>`` (one log line).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from eerld import files
from eerld.errors import ConfigError
from eerld.files import atomic_write_json, read_json_object

log = structlog.get_logger("eerld.clocks")

LEDGER_FILE = "ledger.json"
LEDGER_VERSION = 1
MAX_GPU_INDEX = 1 << 20
MAX_TEXT_CHARS = 1024


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A GPU that may hold a lock taken by eerld."""

    index: int
    uuid: str
    owner: str
    """``"session"``, ``"pin"``: why it was locked (for the start-up log)."""


def parse_ledger(path: Path, data: Mapping[str, Any]) -> dict[int, LedgerEntry]:
    """The entries of a ledger document; ConfigError naming the file and the field for anything else."""
    version = data.get("version", LEDGER_VERSION)
    if version != LEDGER_VERSION or isinstance(version, bool):
        raise ConfigError(f"{path}: version: expected {LEDGER_VERSION}, got {version!r}")
    items = data.get("locked", [])
    if not isinstance(items, list):
        raise ConfigError(f"{path}: locked: expected a list, got {_kind(items)}")
    entries: dict[int, LedgerEntry] = {}
    for n, item in enumerate(items):
        where = f"{path}: locked[{n}]"
        if not isinstance(item, dict):
            raise ConfigError(f"{where}: expected an object, got {_kind(item)}")
        index = item.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index <= MAX_GPU_INDEX:
            raise ConfigError(f"{where}.index: expected a GPU index (0-{MAX_GPU_INDEX}), got {index!r:.80}")
        texts: list[str] = []
        for name in ("uuid", "owner"):
            value = item.get(name, "")
            if not isinstance(value, str) or len(value) > MAX_TEXT_CHARS:
                raise ConfigError(f"{where}.{name}: expected a string, got {_kind(value)}")
            texts.append(value)
        entries[index] = LedgerEntry(index, texts[0], texts[1])
    return entries


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


class Ledger:
    """The set of GPUs that may be locked, persisted on every change of membership.

    Only membership is persisted (a new clock on an already-listed GPU needs no write), which keeps the
    fsync off the hot path of a phase change while keeping the one property that matters: a locked GPU is
    always listed on disk.
    """

    def __init__(self, state_dir: Path) -> None:
        files.check_private_dir(state_dir, "--state-dir")
        self._path = state_dir / LEDGER_FILE
        self._lock = threading.Lock()
        self._entries: dict[int, LedgerEntry] = {}
        """As on disk; replaced whole (never changed in place), so the hot path reads it without the lock."""
        self._unwanted: set[int] = set()
        """Listed on disk, but reset: to drop with the next write that succeeds."""
        self._corrupt = ""
        self._retry_warned = False
        try:
            self._entries = parse_ledger(self._path, read_json_object(self._path))
        except ConfigError as e:
            self._corrupt = str(e)

    @property
    def path(self) -> Path:
        """Where the ledger lives."""
        return self._path

    @property
    def corrupt(self) -> str:
        """Why the file on disk could not be read ("" when it could): until set aside, no entry is known."""
        return self._corrupt

    def set_aside(self) -> Path | None:
        """Move a corrupt ledger out of the way (after every GPU was reset); the new path, None if sound.

        OSError when the rename fails (the ledger stays corrupt, so the next start resets every GPU again).
        """
        with self._lock:
            if not self._corrupt:
                return None
            moved = files.set_aside(self._path)
            log.warning("ledger_set_aside", path=str(self._path), moved_to=str(moved), reason=self._corrupt)
            self._corrupt = ""
            self._entries = {}
            self._unwanted.clear()
            return moved

    def _check_sound(self) -> None:
        if self._corrupt:
            raise ConfigError(f"{self._corrupt} (reset every GPU, then set the ledger aside)")

    def entries(self) -> Mapping[int, LedgerEntry]:
        """A copy of the GPUs listed on disk; ConfigError while a corrupt file is not set aside."""
        with self._lock:
            self._check_sound()
            return dict(self._entries)

    def add(self, entry: LedgerEntry) -> None:
        """List a GPU durably before it is locked; a no-op when it is listed on disk already.

        OSError (a full disk) when the record cannot be written: nothing is listed, the GPU must not be
        locked, and a retry writes again.
        """
        if entry.index in self._entries:  # hot path of every phase change: no lock, no write
            if entry.index in self._unwanted:
                with self._lock:
                    self._unwanted.discard(entry.index)  # locked again: keep it listed
            return
        with self._lock:
            self._check_sound()
            if entry.index in self._entries:
                self._unwanted.discard(entry.index)
                return
            wanted = {i: e for i, e in self._entries.items() if i not in self._unwanted}
            wanted[entry.index] = entry
            self._write(wanted)

    def remove(self, index: int) -> None:
        """Unlist a GPU after it was reset; a no-op when it is not listed.

        OSError when the file cannot be written: the GPU stays listed on disk (a restart resets it again,
        which is harmless) and its removal is retried with the next write.
        """
        with self._lock:
            if index not in self._entries:
                return
            self._check_sound()
            self._unwanted.add(index)
            self._write({i: e for i, e in self._entries.items() if i not in self._unwanted})

    def retry_removals(self) -> bool:
        """Write the removals a failed write left pending; True when none is pending any more."""
        with self._lock:
            if not self._unwanted or self._corrupt:
                return not self._unwanted
            try:
                self._write({i: e for i, e in self._entries.items() if i not in self._unwanted})
            except OSError as e:
                if not self._retry_warned:  # once per outage, not at every reaper tick
                    log.warning("ledger_write_failed", path=str(self._path), reason=e.strerror or str(e))
                    self._retry_warned = True
                return False
            self._retry_warned = False
            return True

    def replace(self, entries: Iterable[LedgerEntry]) -> None:
        """List exactly ``entries`` (durably; OSError leaves the ledger as it was). A corrupt one is allowed:
        the caller (``--reset-clocks``) has reset every GPU and lists those it could not reset."""
        with self._lock:
            self._write({e.index: e for e in entries})
            self._corrupt = ""

    def clear(self) -> None:
        """Unlist every GPU (after all were reset)."""
        with self._lock:
            self._check_sound()
            self._write({})

    def _write(self, entries: dict[int, LedgerEntry]) -> None:
        """Write ``entries``; memory follows only once they are on disk (lock held)."""
        items = [
            {"index": e.index, "uuid": e.uuid, "owner": e.owner}
            for e in sorted(entries.values(), key=lambda e: e.index)
        ]
        atomic_write_json(self._path, {"version": LEDGER_VERSION, "locked": items})
        self._entries = entries
        self._unwanted &= set(entries)


__all__ = [
    "LEDGER_FILE",
    "Ledger",
    "LedgerEntry",
    "atomic_write_json",
    "parse_ledger",
    "read_json_object",
]
