"""Where the simulated GPUs' state lives: in memory (one process) or in a shared state file.

The state file is JSON (format in docs/sim-backend.md). Every change is a transaction under an
exclusive ``fcntl.flock`` on ``<file>.lock`` and is written atomically (temp file in the same
directory, optionally ``fsync``, ``rename``), so a process killed mid-write leaves the previous state
whole; reads need no lock, and re-use the parsed state while the file is unchanged. Because the
state — clock locks included — lives in the file, it outlives a killed daemon as a real GPU's
settings do.

The file is read as untrusted input: a field of the wrong type or an absurd value (a string for a
number, a non-finite number, an unknown fault) is :class:`CorruptState` naming the field, which the device
turns into one ``ConfigError`` naming the file, never a ``TypeError`` later. A corrupt file is not set
aside: it is the simulated hardware, and a device that silently forgot its locks would let a crash test
pass that should fail (docs/sim-backend.md); remove it to start fresh.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import math
import os
import secrets
import threading
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from eerl_sim.gpu.state import (
    HISTORY_COLUMNS,
    QUEUE_COLUMNS,
    Fault,
    FloatArray,
    GpuState,
    Head,
    PendingSwitch,
    as_row,
)
from eerl_sim.profiles import GpuProfile

STATE_FORMAT = "eerl-sim-device"
STATE_VERSION = 1
FAULT_ERRORS = frozenset({"NoPermission", "NotSupported", "GpuLost", "InvalidArgument", "BackendFailure"})
"""The error kinds a fault may name (``eerl_sim.gpu.faults.INJECTABLE_ERRORS``)."""
CLOCK_KINDS = frozenset({"real", "virtual"})


class CorruptState(ValueError):
    """The state file exists but cannot be read as a device state; the message says why."""


@dataclass(frozen=True, slots=True)
class ClockBinding:
    """How simulated time is counted for this device; every process sharing it must agree."""

    kind: str
    speedup: float | None = None
    epoch_monotonic_s: float | None = None
    boot_id: str | None = None


@dataclass(slots=True)
class DeviceState:
    """The whole simulated node: its profile, seed, time base and one :class:`GpuState` per GPU."""

    profile: GpuProfile
    seed: int
    clock: ClockBinding
    gpus: list[GpuState]
    _changed: set[int] = field(default_factory=set, repr=False, compare=False)

    def copy_for_change(self) -> DeviceState:
        """A copy for a transaction that shares the GPUs until :meth:`gpu_for_change` copies one.

        A stored state is never changed in place, so an unchanged GPU keeps its object from one stored
        state to the next: a transaction copies only what it changes, and a file write re-encodes only
        that (see :class:`FileStore`).
        """
        return DeviceState(self.profile, self.seed, self.clock, list(self.gpus))  # the binding is frozen

    def gpu_for_change(self, index: int) -> GpuState:
        """GPU ``index``, copied first if this state still shares it with the one it was copied from."""
        if index not in self._changed:
            self.gpus[index] = self.gpus[index].copy_for_change()
            self._changed.add(index)
        return self.gpus[index]


@dataclass(slots=True)
class Transaction:
    """What a transaction body sees: the state (``None`` when there is none yet) and whether to write it."""

    state: DeviceState | None
    write: bool = True


class StateStore(Protocol):
    """Shared storage of a :class:`DeviceState`."""

    @property
    def description(self) -> str:
        """Where the state lives, for messages."""
        ...

    def load(self) -> DeviceState | None:
        """The current state (``None`` if there is none), shared: callers must not change it."""
        ...

    def transaction(self) -> contextlib.AbstractContextManager[Transaction]:
        """Exclusive access; the state set on the transaction is stored when the body exits normally."""
        ...


class MemoryStore:
    """State in this process only (no sharing, nothing outlives the process)."""

    def __init__(self) -> None:
        self._state: DeviceState | None = None
        self._lock = threading.RLock()

    @property
    def description(self) -> str:
        """``"memory"``."""
        return "memory"

    def load(self) -> DeviceState | None:
        """The state; never changed in place (a transaction replaces it whole, so no lock is needed)."""
        return self._state

    def transaction(self) -> _MemoryTransaction:
        """Exclusive within the process; a body that raises leaves the state untouched."""
        return _MemoryTransaction(self)

    def _begin(self) -> Transaction:
        self._lock.acquire()
        try:
            return Transaction(None if self._state is None else self._state.copy_for_change())
        except BaseException:
            self._lock.release()
            raise

    def _end(self, txn: Transaction, *, commit: bool) -> None:
        try:
            if commit and txn.write and txn.state is not None:
                self._state = txn.state
        finally:
            self._lock.release()


class _MemoryTransaction:
    """:meth:`MemoryStore.transaction` as a plain context manager: every simulated clock lock opens one,
    and a generator-based one costs a daemon's BeginPhase several µs more on cold CPU caches."""

    __slots__ = ("_store", "_txn")

    def __init__(self, store: MemoryStore) -> None:
        self._store = store

    def __enter__(self) -> Transaction:
        self._txn = self._store._begin()
        return self._txn

    def __exit__(self, exc_type: type[BaseException] | None, exc: object, tb: object) -> None:
        self._store._end(self._txn, commit=exc_type is None)


class FileStore:
    """State in a JSON file shared by processes; changes under ``flock`` on ``<file>.lock``.

    Every write goes to a new temp file that is renamed over the state file, so the file is never
    changed in place: a reader that opens it sees one whole state, and needs no lock. That also makes
    the file's identity a cheap version number: a read ``stat``s the path and re-uses the state it
    parsed last while the path still names the same file (device, inode, size, mtime). The store keeps
    that file open, so its inode cannot be freed and handed to a later write while the cache uses it.

    ``durable=True`` also ``fsync``s each write (≈ 7–10 ms on a disk). Without it (the default) writes
    stay atomic for readers and survive any process's death (the page cache does); only a power loss
    could drop the last write, and a power loss is a reboot, which resets the simulated device anyway
    (a state file from before a reboot is discarded). The directory is not fsynced for the same reason.
    """

    def __init__(self, path: Path, *, durable: bool = False) -> None:
        self.path = Path(path)
        self.durable = durable
        self.lock_path = self.path.with_name(self.path.name + ".lock")
        self._cache_lock = threading.Lock()
        self._cache: _Parsed | None = None
        # The open descriptor of the cached file, closed with the store (pins its inode, see above).
        self._pin: list[int] = []
        weakref.finalize(self, _close_all, self._pin)
        self._encoder = StateEncoder()

    @property
    def description(self) -> str:
        """The state file's path."""
        return str(self.path)

    @contextlib.contextmanager
    def _flock(self, mode: int) -> Iterator[None]:
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, mode)
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the lock

    def _cached(self, key: _FileKey) -> DeviceState | None:
        with self._cache_lock:
            if self._cache is not None and self._cache.key == key:
                return self._cache.state
        return None

    def _remember(self, key: _FileKey, fd: int, state: DeviceState) -> None:
        """Cache ``state`` as the contents of the file open at ``fd`` (the store takes the descriptor)."""
        with self._cache_lock:
            old = list(self._pin)
            self._pin[:] = [fd]
            self._cache = _Parsed(key, state)
        _close_all(old)

    def _read(self) -> DeviceState | None:
        """The parsed file, shared with the cache (parsed again only when the path names another file)."""
        try:
            state = self._cached(_file_key(os.stat(self.path)))
        except FileNotFoundError:
            return None
        if state is not None:
            return state
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            key = _file_key(os.fstat(fd))
            state = self._cached(key)  # another thread may have parsed it meanwhile
            if state is None:
                state = decode_state(_read_all(fd))
        except BaseException:
            os.close(fd)
            raise
        self._remember(key, fd, state)
        return state

    def load(self) -> DeviceState | None:
        """The current state (CorruptState if the file cannot be parsed); do not change it.

        No lock: the file is only ever replaced by a rename, so what is opened is one whole state.
        """
        return self._read()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Read, let the body change the state, write it atomically — all under an exclusive lock."""
        with self._flock(fcntl.LOCK_EX):
            current = self._read()
            txn = Transaction(None if current is None else current.copy_for_change())
            yield txn
            if txn.write and txn.state is not None:
                key, fd = self._write_atomically(self._encoder.encode(txn.state))
                self._remember(key, fd, txn.state)

    def _write_atomically(self, raw: bytes) -> tuple[_FileKey, int]:
        """Write a temp file and rename it over the state file; its key and its (still open) descriptor.

        A rename changes neither the inode nor the mtime, so the key is the state file's from now on.
        """
        directory = self.path.parent
        tmp = directory / f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            mode = self.path.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o600
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
        try:
            view = memoryview(raw)
            while view:
                view = view[os.write(fd, view) :]
            if self.durable:
                os.fsync(fd)
            key = _file_key(os.fstat(fd))
            os.replace(tmp, self.path)
        except BaseException:
            os.close(fd)
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        return key, fd


_FileKey = tuple[int, int, int, int]


@dataclass(frozen=True, slots=True)
class _Parsed:
    key: _FileKey
    state: DeviceState


def _file_key(st: os.stat_result) -> _FileKey:
    """Which file, and which version of it: device, inode, size, modification time."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def _close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)
    fds.clear()


# ---- encoding ------------------------------------------------------------------------------------------


def _encode_rows(rows: FloatArray) -> dict[str, Any]:
    data = np.ascontiguousarray(rows, dtype="<f8")
    return {"rows": int(data.shape[0]), "f8le": base64.b64encode(data.tobytes()).decode("ascii")}


def _decode_rows(obj: Any, columns: int, what: str) -> FloatArray:
    if (
        not isinstance(obj, dict)
        or not isinstance(obj.get("rows"), int)
        or not isinstance(obj.get("f8le"), str)
    ):
        raise CorruptState(f"{what}: expected {{'rows': int, 'f8le': base64}}")
    raw = base64.b64decode(obj["f8le"], validate=True)
    data = np.frombuffer(raw, dtype="<f8").astype(np.float64)
    if data.size != obj["rows"] * columns:
        raise CorruptState(f"{what}: {data.size} numbers for {obj['rows']} rows of {columns}")
    return data.reshape(obj["rows"], columns)


_HEAD_FIELDS = tuple(f.name for f in fields(Head))


def _encode_pending(pending: PendingSwitch | None) -> dict[str, Any] | None:
    return None if pending is None else {"cap_mhz": pending.cap_mhz, "at_s": pending.at_s}


def _encode_gpu(gpu: GpuState) -> dict[str, Any]:
    return {
        "time_s": gpu.time_s,
        "energy_j": gpu.energy_j,
        "step_energy_j": gpu.step_energy_j,
        "counter_base_mj": gpu.counter_base_mj,
        "sm_lock_mhz": gpu.sm_lock_mhz,
        "app_sm_clock_mhz": gpu.app_sm_clock_mhz,
        "app_mem_clock_mhz": gpu.app_mem_clock_mhz,
        "mem_lock_mhz": gpu.mem_lock_mhz,
        "cap_mhz": gpu.cap_mhz,
        "pending": _encode_pending(gpu.pending),
        "queue": _encode_rows(gpu.queue),
        "head_seq": gpu.head_seq,
        "head": None if gpu.head is None else {name: getattr(gpu.head, name) for name in _HEAD_FIELDS},
        "history": _encode_rows(gpu.full_history()),
        "marks": gpu.marks,
        "lost": gpu.lost,
        "faults": {name: {"error": f.error, "once": f.once} for name, f in gpu.faults.items()},
    }


def _opt_int(value: Any, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptState(f"{what}: expected an integer or null, got {value!r}")
    return value


def _num(value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise CorruptState(f"{what}: expected a finite number, got {value!r:.80}")
    return float(value)


def _opt_num(value: Any, what: str) -> float | None:
    return None if value is None else _num(value, what)


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise CorruptState(f"{what}: expected an integer, got {value!r:.80}")
    return value


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise CorruptState(f"{what}: expected true or false, got {value!r:.80}")
    return value


def _object(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise CorruptState(
            f"{what}: expected an object, got {'null' if value is None else type(value).__name__}"
        )
    return value


def _decode_head(obj: Any, where: str) -> Head:
    head = _object(obj, where)
    values: dict[str, Any] = {}
    for f in fields(Head):
        if f.name not in head:
            raise CorruptState(f"{where}.{f.name}: missing")
        value = head[f.name]
        what = f"{where}.{f.name}"
        values[f.name] = _bool(value, what) if f.name == "power_capped" else _num(value, what)
    return Head(**values)


def _decode_fault(obj: Any, where: str) -> Fault:
    fault = _object(obj, where)
    error = fault.get("error")
    if error not in FAULT_ERRORS:
        raise CorruptState(
            f"{where}.error: expected one of {', '.join(sorted(FAULT_ERRORS))}, got {error!r:.80}"
        )
    return Fault(str(error), _bool(fault.get("once"), f"{where}.once"))


def _decode_mark(value: Any, where: str) -> list[float] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise CorruptState(f"{where}: expected a list of numbers or null, got {type(value).__name__}")
    return [_num(x, f"{where}[{i}]") for i, x in enumerate(value)]


def decode_clock(obj: Any) -> ClockBinding:
    """The state's clock binding; CorruptState naming the field for a wrong type."""
    clock = _object(obj, "clock")
    unknown = set(clock) - {f.name for f in fields(ClockBinding)}
    if unknown:
        raise CorruptState(f"clock: unknown fields {sorted(unknown)}")
    kind = clock.get("kind")
    if kind not in CLOCK_KINDS:
        raise CorruptState(f"clock.kind: expected 'real' or 'virtual', got {kind!r:.80}")
    speedup = _opt_num(clock.get("speedup"), "clock.speedup")
    if speedup is not None and speedup <= 0:
        raise CorruptState(f"clock.speedup: expected a positive number, got {speedup!r}")
    boot_id = clock.get("boot_id")
    if boot_id is not None and not isinstance(boot_id, str):
        raise CorruptState(f"clock.boot_id: expected a string or null, got {type(boot_id).__name__}")
    return ClockBinding(
        str(kind), speedup, _opt_num(clock.get("epoch_monotonic_s"), "clock.epoch_monotonic_s"), boot_id
    )


def _decode_gpu(obj: Any, index: int) -> GpuState:
    where = f"gpus[{index}]"
    if not isinstance(obj, dict):
        raise CorruptState(f"{where}: expected an object")
    try:
        pending = obj["pending"]
        head = obj["head"]
        marks = _object(obj["marks"], f"{where}.marks")
        faults = _object(obj["faults"], f"{where}.faults")
        history = _decode_rows(obj["history"], len(HISTORY_COLUMNS), f"{where}.history")
        if pending is not None:
            pending = _object(pending, f"{where}.pending")
        return GpuState(
            time_s=_num(obj["time_s"], f"{where}.time_s"),
            energy_j=_num(obj["energy_j"], f"{where}.energy_j"),
            step_energy_j=_num(obj["step_energy_j"], f"{where}.step_energy_j"),
            counter_base_mj=_num(obj["counter_base_mj"], f"{where}.counter_base_mj"),
            sm_lock_mhz=_opt_int(obj["sm_lock_mhz"], f"{where}.sm_lock_mhz"),
            app_sm_clock_mhz=_opt_int(obj["app_sm_clock_mhz"], f"{where}.app_sm_clock_mhz"),
            app_mem_clock_mhz=_opt_int(obj["app_mem_clock_mhz"], f"{where}.app_mem_clock_mhz"),
            mem_lock_mhz=_opt_int(obj["mem_lock_mhz"], f"{where}.mem_lock_mhz"),
            cap_mhz=_opt_int(obj["cap_mhz"], f"{where}.cap_mhz"),
            pending=None
            if pending is None
            else PendingSwitch(
                _opt_int(pending["cap_mhz"], f"{where}.pending.cap_mhz"),
                _num(pending["at_s"], f"{where}.pending.at_s"),
            ),
            queue=_decode_rows(obj["queue"], len(QUEUE_COLUMNS), f"{where}.queue"),
            head_seq=_int(obj["head_seq"], f"{where}.head_seq"),
            head=None if head is None else _decode_head(head, f"{where}.head"),
            history=history[:-1],
            history_tail=as_row(history[-1]) if history.shape[0] else None,
            marks={str(k): _decode_mark(v, f"{where}.marks.{k}") for k, v in marks.items()},
            lost=_bool(obj["lost"], f"{where}.lost"),
            faults={str(k): _decode_fault(v, f"{where}.faults.{k}") for k, v in faults.items()},
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CorruptState):
            raise
        raise CorruptState(f"{where}: {type(exc).__name__}: {exc}") from exc


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


def _encode_header(state: DeviceState) -> str:
    """The document up to the GPU list: ``{"format":…,"clock":{…},"gpus":[``."""
    doc = {
        "format": STATE_FORMAT,
        "version": STATE_VERSION,
        "profile": asdict(state.profile),
        "seed": state.seed,
        "clock": asdict(state.clock),
    }
    return _dumps(doc)[:-1] + ',"gpus":['


def encode_state(state: DeviceState) -> bytes:
    """The state file's bytes."""
    return StateEncoder().encode(state)


class StateEncoder:
    """:func:`encode_state` that re-uses the JSON of GPUs (and the header) unchanged since its last call.

    A GPU is unchanged while it is the same object (states are never changed in place, see
    :meth:`DeviceState.copy_for_change`).
    """

    def __init__(self) -> None:
        self._gpus: list[tuple[GpuState, str]] = []
        self._header: tuple[GpuProfile, int, ClockBinding, str] | None = None

    def encode(self, state: DeviceState) -> bytes:
        """The state file's bytes."""
        header = self._header
        if header is None or (header[0], header[1], header[2]) != (state.profile, state.seed, state.clock):
            header = (state.profile, state.seed, state.clock, _encode_header(state))
            self._header = header
        old = self._gpus
        parts = [
            old[i] if i < len(old) and old[i][0] is gpu else (gpu, _dumps(_encode_gpu(gpu)))
            for i, gpu in enumerate(state.gpus)
        ]
        self._gpus = parts
        return (header[3] + ",".join(text for _, text in parts) + "]}\n").encode()


def decode_state(raw: bytes) -> DeviceState:
    """Parse a state file; CorruptState names what is wrong."""
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CorruptState(f"not JSON ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != STATE_FORMAT:
        raise CorruptState(f"not an eerl sim device state (missing 'format': {STATE_FORMAT!r})")
    if doc.get("version") != STATE_VERSION:
        raise CorruptState(f"unsupported version {doc.get('version')!r} (this eerld reads {STATE_VERSION})")
    clock = decode_clock(doc.get("clock"))
    try:
        profile = GpuProfile(**doc["profile"])
        profile.validate("state file")
        seed = doc["seed"]
        gpus = doc["gpus"]
    except Exception as exc:
        raise CorruptState(f"bad header: {type(exc).__name__}: {exc}") from exc
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise CorruptState(f"seed: expected an integer, got {seed!r}")
    if not isinstance(gpus, list) or not gpus:
        raise CorruptState("gpus: expected a non-empty list")
    return DeviceState(profile, seed, clock, [_decode_gpu(g, i) for i, g in enumerate(gpus)])
