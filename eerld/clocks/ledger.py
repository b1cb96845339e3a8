"""The lock ledger: a crash-safe record of every GPU that eerld may have left locked.

A GPU is written to the ledger *before* its clock is locked and removed only *after* it was reset, so
whatever way the daemon dies (SIGKILL, OOM, power cut of the host process), the next start knows which
GPUs to reset. Writes are atomic: a temp file in the same directory, fsync, rename, fsync of the directory;
the file is mode 0600 because it lives in a root-owned state directory.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eerld.errors import ConfigError

LEDGER_FILE = "ledger.json"


def atomic_write_json(path: Path, data: Any) -> None:
    """Replace ``path`` with ``data`` as JSON so that a reader sees the old or the new file, never a mix."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    payload = json.dumps(data, indent=2, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, payload)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def read_json_object(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``{}`` when the file is missing; ConfigError when it is not an object."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object")
    return data


@dataclass(frozen=True, slots=True)
class LedgerEntry:
    """A GPU that may hold a lock taken by eerld."""

    index: int
    uuid: str
    owner: str
    """``"session"``, ``"pin"``: why it was locked (for the start-up log)."""


class Ledger:
    """The set of GPUs that may be locked, persisted on every change of membership.

    Only membership is persisted (a new clock on an already-listed GPU needs no write), which keeps the
    fsync off the hot path of a phase change while keeping the one property that matters: a locked GPU is
    always listed.
    """

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / LEDGER_FILE
        self._lock = threading.Lock()
        self._entries: dict[int, LedgerEntry] = self._load()

    @property
    def path(self) -> Path:
        """Where the ledger lives."""
        return self._path

    def _load(self) -> dict[int, LedgerEntry]:
        data = read_json_object(self._path)
        entries: dict[int, LedgerEntry] = {}
        for item in data.get("locked", []):
            if not isinstance(item, dict) or not isinstance(item.get("index"), int):
                raise ConfigError(f"{self._path}: malformed entry {item!r}")
            index = item["index"]
            entries[index] = LedgerEntry(index, str(item.get("uuid", "")), str(item.get("owner", "")))
        return entries

    def entries(self) -> Mapping[int, LedgerEntry]:
        """A copy of the GPUs listed now."""
        with self._lock:
            return dict(self._entries)

    def add(self, entry: LedgerEntry) -> None:
        """List a GPU (durably) before it is locked; a no-op when it is already listed."""
        if entry.index in self._entries:  # hot path of every phase change: no lock, no write
            return
        with self._lock:
            if entry.index in self._entries:
                return
            self._entries[entry.index] = entry
            self._write()

    def remove(self, index: int) -> None:
        """Unlist a GPU after it was reset; a no-op when it is not listed."""
        with self._lock:
            if self._entries.pop(index, None) is not None:
                self._write()

    def clear(self) -> None:
        """Unlist every GPU (after all were reset)."""
        with self._lock:
            self._entries.clear()
            self._write()

    def _write(self) -> None:
        items = [
            {"index": e.index, "uuid": e.uuid, "owner": e.owner}
            for e in sorted(self._entries.values(), key=lambda e: e.index)
        ]
        atomic_write_json(self._path, {"version": 1, "locked": items})
