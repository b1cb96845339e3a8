"""Admin pins, kept in the state directory so that an admin's intent outlives a daemon crash or restart.

Pins are keyed by GPU UUID (indices can be renumbered across boots); expiry is wall-clock time because it
must mean the same after a restart.

The file is read as untrusted input, like a Pin RPC: a pin of the wrong type or an absurd value is dropped
with one ``pin_dropped`` warning naming the file and the field (:func:`parse_pin`); a file that is not a
JSON object with a list of pins is set aside (``pins.json.corrupt-<unix time>``) and the daemon starts
with no pin, the safe direction (the GPUs run at their default clocks). Whether a pin's clocks suit its
GPU is checked at start by :func:`pin_problem`, as the Pin RPC checks them.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
from eerl.clocks import nearest_supported_text

from eerld import files
from eerld.errors import ConfigError, Unavailable
from eerld.files import atomic_write_json, read_json_object

log = structlog.get_logger("eerld.clocks")

PINS_FILE = "pins.json"
MAX_SM_CLOCK_MHZ = 10_000
MAX_MEM_CLOCK_MHZ = 40_000
MAX_UUID_CHARS = 256
MAX_REASON_CHARS = 1024
MAX_UNIX_S = 1e11
"""Year ~5138: a timestamp beyond it is not a time."""


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
    set_by: str = ""
    """Who set it, in words (the admin socket's owner and the user eerlctl reported); "" when unknown (a
    pin written by an older eerld)."""

    def expired(self, now_unix_s: float) -> bool:
        """Whether the pin has run out at ``now_unix_s``."""
        return self.expires_at_unix_s > 0 and now_unix_s >= self.expires_at_unix_s


def _int_field(item: Mapping[str, Any], name: str, minimum: int, maximum: int, default: int | None) -> int:
    value = item.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not minimum <= value <= maximum:
        raise ValueError(f"{name}: expected an integer {minimum}-{maximum}, got {value!r:.80}")
    return value


def _time_field(item: Mapping[str, Any], name: str) -> float:
    value = item.get(name, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number, got {value!r:.80}")
    # Range first: an integer too large for a float would make math.isfinite raise OverflowError.
    if not 0 <= value <= MAX_UNIX_S or not math.isfinite(value):
        raise ValueError(f"{name}: expected a unix time, got {value!r:.80}")
    return float(value)


def _text_field(item: Mapping[str, Any], name: str, maximum: int, *, required: bool) -> str:
    value = item.get(name, "")
    if not isinstance(value, str):
        raise ValueError(f"{name}: expected a string, got {type(value).__name__}")
    if required and not value:
        raise ValueError(f"{name}: required")
    if len(value) > maximum or any(not ch.isprintable() for ch in value):
        raise ValueError(f"{name}: expected at most {maximum} printable characters")
    return value


def parse_pin(item: object) -> Pin:
    """A pin from its JSON form; ValueError naming the field for a wrong type or an absurd value."""
    if not isinstance(item, dict):
        raise ValueError(f"expected an object, got {'null' if item is None else type(item).__name__}")
    return Pin(
        uuid=_text_field(item, "uuid", MAX_UUID_CHARS, required=True),
        sm_clock_mhz=_int_field(item, "sm_clock_mhz", 1, MAX_SM_CLOCK_MHZ, None),
        mem_clock_mhz=_int_field(item, "mem_clock_mhz", 0, MAX_MEM_CLOCK_MHZ, 0),
        reason=_text_field(item, "reason", MAX_REASON_CHARS, required=False),
        created_at_unix_s=_time_field(item, "created_at_unix_s"),
        expires_at_unix_s=_time_field(item, "expires_at_unix_s"),
        set_by=_text_field(item, "set_by", MAX_REASON_CHARS, required=False),
    )


def pin_problem(pin: Pin, supported_sm_mhz: Sequence[int], supported_mem_mhz: Sequence[int]) -> str:
    """Why ``pin`` cannot be applied to a GPU with these supported clocks ("" when it can; an empty list:
    not known, so not checked), in the words of the Pin RPC's validation."""
    if supported_sm_mhz and pin.sm_clock_mhz not in supported_sm_mhz:
        return f"sm_clock_mhz: {pin.sm_clock_mhz} MHz is not supported by the GPU; " + nearest_supported_text(
            supported_sm_mhz, pin.sm_clock_mhz
        )
    if pin.mem_clock_mhz and supported_mem_mhz and pin.mem_clock_mhz not in supported_mem_mhz:
        return (
            f"mem_clock_mhz: {pin.mem_clock_mhz} MHz is not supported by the GPU; "
            f"supported: {', '.join(str(c) for c in sorted(supported_mem_mhz))} MHz"
        )
    return ""


class PinStore:
    """Persisted pins by GPU UUID; a new pin is written durably before it takes effect."""

    def __init__(self, state_dir: Path) -> None:
        files.check_private_dir(state_dir, "--state-dir")
        self._path = state_dir / PINS_FILE
        self._lock = threading.Lock()
        self._dirty = False
        """Memory differs from the file (a dropped pin, or a removal that could not be written)."""
        self._pins: dict[str, Pin] = self._load()

    @property
    def path(self) -> Path:
        """Where the pins live."""
        return self._path

    def _load(self) -> dict[str, Pin]:
        try:
            data = read_json_object(self._path, private=True)
            items = data.get("pins", [])
            if not isinstance(items, list):
                raise ConfigError(f"{self._path}: pins: expected a list, got {type(items).__name__}")
        except ConfigError as e:
            self._set_aside(str(e))
            return {}
        pins: dict[str, Pin] = {}
        for n, item in enumerate(items):
            try:
                pin = parse_pin(item)
            except ValueError as e:
                self.warn_dropped(f"pins[{n}]", str(e))
                continue
            pins[pin.uuid] = pin
        return pins

    def _set_aside(self, reason: str) -> None:
        try:
            moved = files.set_aside(self._path)
        except OSError as e:
            log.warning("pins_unreadable", path=str(self._path), reason=reason, set_aside_failed=e.strerror)
            return
        log.warning("pins_set_aside", path=str(self._path), moved_to=str(moved), reason=reason)

    def warn_dropped(self, which: str, problem: str) -> None:
        """Log one ``pin_dropped`` warning; the next write leaves the pin out of the file."""
        self._dirty = True
        log.warning("pin_dropped", path=str(self._path), pin=which, problem=problem)

    def all(self) -> Mapping[str, Pin]:
        """A copy of every pin, by UUID."""
        with self._lock:
            return dict(self._pins)

    def get(self, uuid: str) -> Pin | None:
        """The pin of one GPU, if any."""
        with self._lock:
            return self._pins.get(uuid)

    def put_many(self, pins: list[Pin]) -> None:
        """Add or replace pins in one durable write; Unavailable (nothing changes) if it cannot be written."""
        with self._lock:
            wanted = dict(self._pins)
            for pin in pins:
                wanted[pin.uuid] = pin
            try:
                self._write(wanted)
            except OSError as e:
                raise Unavailable(f"cannot record the pin in {self._path}: {e.strerror or e}") from e

    def remove_many(self, uuids: list[str]) -> list[Pin]:
        """Remove pins; return those that existed.

        Removal takes effect even when the file cannot be written (the GPUs go back towards their default
        clocks, the safe direction); the write is retried by :meth:`flush` and with the next change.
        """
        with self._lock:
            removed = [p for u in uuids if (p := self._pins.get(u)) is not None]
            if not removed and not self._dirty:
                return []
            wanted = {u: p for u, p in self._pins.items() if u not in uuids}
            try:
                self._write(wanted)
            except OSError as e:
                self._pins = wanted
                self._dirty = True
                log.warning("pins_write_failed", path=str(self._path), reason=e.strerror or str(e))
            return removed

    def flush(self) -> bool:
        """Write the pins if memory and file differ; True when they agree afterwards."""
        with self._lock:
            if not self._dirty:
                return True
            try:
                self._write(dict(self._pins))
            except OSError as e:
                log.warning("pins_write_failed", path=str(self._path), reason=e.strerror or str(e))
                return False
            return True

    def _write(self, pins: dict[str, Pin]) -> None:
        """Write ``pins``; memory follows once they are on disk (lock held)."""
        atomic_write_json(self._path, {"version": 1, "pins": [asdict(p) for p in pins.values()]})
        self._pins = pins
        self._dirty = False
