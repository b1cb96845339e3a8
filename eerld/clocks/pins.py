"""Admin pins, kept in the state directory so that an admin's intent outlives a daemon crash or restart.

Pins are keyed by GPU UUID (indices can be renumbered across boots); expiry is wall-clock time because it
must mean the same after a restart.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from eerld.clocks.ledger import atomic_write_json, read_json_object
from eerld.errors import ConfigError

PINS_FILE = "pins.json"


@dataclass(frozen=True, slots=True)
class Pin:
    """An administrator's pin of one GPU's clocks."""

    uuid: str
    sm_clock_mhz: int
    mem_clock_mhz: int
    reason: str
    created_at_unix_s: float
    expires_at_unix_s: float
    """0 means never."""

    def expired(self, now_unix_s: float) -> bool:
        """Whether the pin has run out at ``now_unix_s``."""
        return self.expires_at_unix_s > 0 and now_unix_s >= self.expires_at_unix_s


class PinStore:
    """Persisted pins by GPU UUID; every change is written atomically before it takes effect."""

    def __init__(self, state_dir: Path) -> None:
        self._path = state_dir / PINS_FILE
        self._lock = threading.Lock()
        self._pins: dict[str, Pin] = self._load()

    def _load(self) -> dict[str, Pin]:
        data = read_json_object(self._path)
        pins: dict[str, Pin] = {}
        for item in data.get("pins", []):
            try:
                pin = Pin(
                    uuid=str(item["uuid"]),
                    sm_clock_mhz=int(item["sm_clock_mhz"]),
                    mem_clock_mhz=int(item.get("mem_clock_mhz", 0)),
                    reason=str(item.get("reason", "")),
                    created_at_unix_s=float(item.get("created_at_unix_s", 0.0)),
                    expires_at_unix_s=float(item.get("expires_at_unix_s", 0.0)),
                )
            except (KeyError, TypeError, ValueError) as e:
                raise ConfigError(f"{self._path}: malformed pin {item!r}") from e
            if pin.sm_clock_mhz <= 0 or not math.isfinite(pin.expires_at_unix_s):
                raise ConfigError(f"{self._path}: malformed pin {item!r}")
            pins[pin.uuid] = pin
        return pins

    def all(self) -> Mapping[str, Pin]:
        """A copy of every pin, by UUID."""
        with self._lock:
            return dict(self._pins)

    def get(self, uuid: str) -> Pin | None:
        """The pin of one GPU, if any."""
        with self._lock:
            return self._pins.get(uuid)

    def put_many(self, pins: list[Pin]) -> None:
        """Add or replace pins in one durable write."""
        with self._lock:
            for pin in pins:
                self._pins[pin.uuid] = pin
            self._write()

    def remove_many(self, uuids: list[str]) -> list[Pin]:
        """Remove pins in one durable write; return those that existed."""
        with self._lock:
            removed = [p for u in uuids if (p := self._pins.pop(u, None)) is not None]
            if removed:
                self._write()
            return removed

    def _write(self) -> None:
        atomic_write_json(self._path, {"version": 1, "pins": [asdict(p) for p in self._pins.values()]})
