"""The simulated GPUs as a shared device: clock settings on one side, GPU work on the other.

One :class:`SimDevice` object (per process) gives access to the simulated GPUs of a node. The daemon
reaches it through :class:`eerl_sim.gpu.SimBackend` (clock locks, counters); simulated RL workers, in
the same or other processes, call :meth:`SimDevice.run_segments` to execute phase work on the same GPUs.
With a state file the GPUs' state is shared by every process that opens it, and outlives them all.

Work is queued on a GPU and executed lazily by :class:`eerl_sim.gpu.model.GpuModel` whenever anyone
looks at or changes that GPU, so the clock a segment runs at is exactly the clock that holds when it
starts, whoever changed it; a worker only keeps the queue fed and waits for its work to finish.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import structlog

from eerl_sim.gpu.clock import RealTimeClock, SimClock
from eerl_sim.gpu.faults import FAULTABLE_METHODS, INJECTABLE_ERRORS, fault_error, take_fault
from eerl_sim.gpu.model import GpuModel
from eerl_sim.gpu.opening import (
    bind_existing,
    bind_fresh,
    check_matches,
    fresh_state,
    gpu_pci_bus_id,
    gpu_uuid,
    rebooted,
)
from eerl_sim.gpu.state import QUEUE_COLUMNS, Fault, FloatArray, GpuState
from eerl_sim.gpu.store import CorruptState, DeviceState, FileStore, MemoryStore, StateStore
from eerl_sim.gpu.work import ArrayLike, WorkResult, WorkTicket, prune_marks, segment_column, take_result
from eerl_sim.profiles import GpuProfile
from eerld.errors import BackendFailure, ConfigError, GpuError, InvalidArgument
from eerld.gpu.base import GpuIdentity

_log = structlog.get_logger(__name__)

T = TypeVar("T")

QUEUE_CAP_SEGMENTS = 1024
"""A worker keeps at most this many segments queued on a GPU (bounds the state file's size)."""

LOOKAHEAD_WALL_S = 0.5
"""A worker keeps about this much wall time of work queued ahead (× speed-up in simulated seconds)."""

MAX_WAIT_WALL_S = 0.5
"""A waiting worker looks at its GPU at least this often (notices a lost GPU)."""


class SimDevice:
    """The simulated GPUs of one node, shared through a :class:`StateStore`.

    Build one with :meth:`create` (fresh or re-opened, profile given) or :meth:`attach` (a worker
    joining an existing state file; profile, GPU count, seed and time base come from the file).
    """

    def __init__(self, store: StateStore, clock: SimClock, state: DeviceState) -> None:
        self.store = store
        self.clock = clock
        self.profile = state.profile
        self.gpus = len(state.gpus)
        self.seed = state.seed
        self.model = GpuModel(state.profile)
        self.identities = tuple(
            GpuIdentity(
                index=i,
                uuid=gpu_uuid(self.seed, i),
                name=self.profile.product_name,
                pci_bus_id=gpu_pci_bus_id(i),
            )
            for i in range(self.gpus)
        )
        self._rngs = [np.random.default_rng([self.seed, i, 1]) for i in range(self.gpus)]
        # Per GPU: the stored GpuState a read last started from, and that state advanced to the read's
        # time. The next read continues from there while the store still holds that same object.
        self._views: dict[int, tuple[GpuState, GpuState]] = {}
        self._views_lock = threading.Lock()
        # Held by each transaction of this process, and while a read loads the state and reads the clock.
        self._order = threading.RLock()

    # ---- construction ------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        profile: GpuProfile,
        gpus: int,
        *,
        clock: SimClock,
        state_file: Path | None = None,
        seed: int = 0,
        durable_writes: bool = False,
    ) -> SimDevice:
        """A device with these parameters; with ``state_file`` re-open the one stored there if present.

        A missing file starts a fresh device. An existing one must match (profile, GPU count, seed and
        the clock's kind and speed-up) or ConfigError says what differs; a corrupt one raises ConfigError
        naming the file (delete it to start fresh). A file written before the machine rebooted starts a
        fresh device, as a reboot resets real GPUs (logged). ``durable_writes=True`` also fsyncs each
        write (see :class:`eerl_sim.gpu.store.FileStore` for why the default does not).
        """
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ConfigError(f"sim GPU count must be a positive integer, got {gpus!r}")
        profile.validate("sim profile")
        store: StateStore = (
            MemoryStore() if state_file is None else FileStore(Path(state_file), durable=durable_writes)
        )
        try:
            with store.transaction() as txn:
                state = txn.state
                if state is not None and rebooted(state.clock):
                    _log.warning("sim_state_reset_after_reboot", state_file=store.description)
                    state = None
                if state is None:
                    clock = bind_fresh(clock)
                    state = fresh_state(profile, gpus, seed, clock)
                    txn.state = state
                else:
                    check_matches(state, profile=profile, gpus=gpus, seed=seed, where=store.description)
                    clock = bind_existing(clock, state.clock, store.description)
                    txn.write = False
        except CorruptState as exc:
            raise ConfigError(
                f"sim state file {store.description} is corrupt ({exc}); remove it to start a fresh device"
            ) from exc
        except OSError as exc:
            raise ConfigError(f"sim state file {store.description}: {exc.strerror or exc}") from exc
        return cls(store, clock, state)

    @classmethod
    def attach(
        cls, state_file: Path, *, clock: SimClock | None = None, durable_writes: bool = False
    ) -> SimDevice:
        """Join the device stored in ``state_file`` (a simulated worker's side); ConfigError if unusable."""
        store = FileStore(Path(state_file), durable=durable_writes)
        try:
            state = store.load()
        except CorruptState as exc:
            raise ConfigError(f"sim state file {state_file} is corrupt ({exc})") from exc
        except OSError as exc:
            raise ConfigError(f"sim state file {state_file}: {exc.strerror or exc}") from exc
        if state is None:
            raise ConfigError(
                f"sim state file {state_file} does not exist (start the daemon or backend first)"
            )
        if clock is None:
            if state.clock.kind != "real" or state.clock.speedup is None:
                raise ConfigError(f"sim state file {state_file} uses a {state.clock.kind} clock; pass one")
            clock = RealTimeClock(state.clock.speedup)
        clock = bind_existing(clock, state.clock, str(state_file))
        return cls(store, clock, state)

    # ---- access to one GPU's state -------------------------------------------------------------------

    def check_index(self, index: int) -> None:
        """InvalidArgument unless ``index`` names a GPU of this device."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < self.gpus:
            raise InvalidArgument(f"no GPU with index {index!r} (this node has {self.gpus})", gpu_index=None)

    def _load(self) -> DeviceState:
        try:
            state = self.store.load()
        except CorruptState as exc:
            raise BackendFailure(f"sim state {self.store.description} is corrupt: {exc}") from exc
        except OSError as exc:
            raise BackendFailure(f"sim state {self.store.description}: {exc}") from exc
        if state is None:
            raise BackendFailure(f"sim state {self.store.description} vanished")
        return state

    @contextmanager
    def _transaction(self) -> Iterator[DeviceState]:
        try:
            with self._order, self.store.transaction() as txn:
                yield self._present(txn.state)
        except (CorruptState, OSError) as exc:
            raise self._store_failure(exc) from exc

    def _present(self, state: DeviceState | None) -> DeviceState:
        if state is None:
            raise BackendFailure(f"sim state {self.store.description} vanished")
        return state

    def _store_failure(self, exc: CorruptState | OSError) -> BackendFailure:
        if isinstance(exc, CorruptState):
            return BackendFailure(f"sim state {self.store.description} is corrupt: {exc}")
        return BackendFailure(f"sim state {self.store.description}: {exc}")

    def _now(self, gpu: GpuState) -> float:
        return max(self.clock.now_s(), gpu.time_s)

    def observe(self, index: int, method: str | None = None) -> GpuState:
        """A private copy of GPU ``index`` advanced to now, after its injected faults for ``method`` fire.

        Reads never write the state back: advancing is deterministic, so any later reader gets the same.
        """
        return self.read(index, method, GpuState.clone)

    def read(self, index: int, method: str | None, measure: Callable[[GpuState], T]) -> T:
        """``measure(gpu)`` on GPU ``index`` advanced to now, after its injected faults for ``method`` fire.

        ``measure`` must not change ``gpu`` or keep it: it is this process's cached view of the GPU. A
        read continues advancing the view of the previous read while nobody has changed the stored state
        since (it would start again from that same stored state), so a read costs what happened since
        the last read rather than since the last write; no copy is made until the state changes.
        """
        stored, now_s = self._checked_at_now(index, method)
        return self._measure_view(index, stored, now_s, measure)

    def _measure_view(
        self, index: int, stored: GpuState, now_s: float, measure: Callable[[GpuState], T]
    ) -> T:
        """``measure`` on this process's view of ``stored`` advanced to ``now_s`` (see :meth:`read`)."""
        with self._views_lock:
            view = self._views.get(index)
            if view is None or view[0] is not stored:
                view = (stored, stored.copy_for_advance())
                self._views[index] = view
            gpu = view[1]
            self.model.advance(gpu, max(now_s, gpu.time_s))
            return measure(gpu)

    def read_counter_mj(self, index: int, method: str | None) -> int:
        """``read(index, method, model.counter_mj)``, without advancing the GPU when it cannot matter.

        The counter moves only at its steps (``energy_counter_period_ms``): while no step has passed since
        the stored state's time, its value is the stored one, exactly. The daemon reads it at every phase
        event, so this is the simulator's hottest read (and the common case: steps are 100 ms apart).
        """
        stored, now_s = self._checked_at_now(index, method)
        if self.model.counter_step_s(now_s) <= stored.time_s:
            return self.model.counter_mj(stored)
        return self._measure_view(index, stored, now_s, self.model.counter_mj)

    def _checked_at_now(self, index: int, method: str | None) -> tuple[GpuState, float]:
        """GPU ``index`` as stored and the time now (:meth:`_load_at_now`), after ``method``'s faults fire."""
        self.check_index(index)
        stored, now_s = self._load_at_now(index)
        if method is not None:
            self._raise_fault(stored, index, method)
            if method in stored.faults:  # another caller consumed that once-fault: the state changed
                stored, now_s = self._load_at_now(index)
        return stored, now_s

    def _load_at_now(self, index: int) -> tuple[GpuState, float]:
        """GPU ``index`` as stored, and the time now: no change by this process falls in between.

        A change this process made at a time before "now" is in the state loaded, and one not in it is
        made later, so a read is never evaluated at a time past a change it does not include (which
        would, for example, let an energy counter read on another thread run backwards after a lock).
        """
        with self._order:
            return self._load().gpus[index], self.clock.now_s()

    def update(self, index: int, method: str | None, body: Callable[[GpuState, float], T]) -> T:
        """Run ``body(gpu, now)`` on GPU ``index`` advanced to now, under the exclusive lock, and store it.

        Injected faults for ``method`` fire first (a once-fault is consumed and stored); if ``body`` raises
        nothing is stored.
        """
        self.check_index(index)
        error: GpuError | None = None
        result: T
        try:  # _transaction() written out: every simulated lock comes here, and the generator costs
            with self._order, self.store.transaction() as txn:
                gpu = self._present(txn.state).gpu_for_change(index)
                error = take_fault(gpu, index, method) if method is not None else None
                if error is None:
                    now = self._now(gpu)
                    self.model.advance(gpu, now)
                    result = body(gpu, now)
        except (CorruptState, OSError) as exc:
            raise self._store_failure(exc) from exc
        if error is not None:
            raise error
        return result

    def _raise_fault(self, gpu: GpuState, index: int, method: str, *, lost_raises: bool = True) -> None:
        if gpu.lost and lost_raises:
            raise fault_error("GpuLost", index, method)
        fault = gpu.faults.get(method)
        if fault is None:
            return
        if not fault.once:
            raise fault_error(fault.error, index, method)
        error: GpuError | None = None
        with self._transaction() as state:  # consume it, unless another caller already did
            error = take_fault(state.gpu_for_change(index), index, method, lost_raises=lost_raises)
        if error is not None:
            raise error

    def check_faults(self, index: int, method: str, *, lost_raises: bool = True) -> None:
        """Raise what is injected for ``method`` on GPU ``index`` (GpuLost if lost); consume a once-fault."""
        self.check_index(index)
        self._raise_fault(self._load().gpus[index], index, method, lost_raises=lost_raises)

    # ---- fault injection ---------------------------------------------------------------------------

    def inject_fault(self, gpu_index: int, method_name: str, error: type[GpuError], *, once: bool) -> None:
        """Make ``method_name`` on GPU ``gpu_index`` raise ``error``, once or until cleared.

        ``error`` is one of NoPermission, NotSupported, GpuLost, InvalidArgument, BackendFailure; a fault on
        ``inventory`` fires when the inventory is listed. Visible to every process sharing the state.
        """
        if method_name not in FAULTABLE_METHODS:
            raise InvalidArgument(
                f"cannot inject a fault into {method_name!r}; one of {sorted(FAULTABLE_METHODS)}"
            )
        if INJECTABLE_ERRORS.get(getattr(error, "__name__", "")) is not error:
            raise InvalidArgument(f"cannot inject {error!r}; one of {sorted(INJECTABLE_ERRORS)}")
        fault = Fault(error.__name__, once)

        def body(gpu: GpuState, _now: float) -> None:
            gpu.faults[method_name] = fault

        self.update(gpu_index, None, body)

    def clear_faults(self, gpu_index: int | None = None) -> None:
        """Remove injected faults and recover lost GPUs (all GPUs, or only ``gpu_index``)."""
        indices = range(self.gpus) if gpu_index is None else [gpu_index]
        for index in indices:
            self.check_index(index)
        with self._transaction() as state:
            for index in indices:
                gpu = state.gpu_for_change(index)
                gpu.faults.clear()
                gpu.lost = False

    def lose_gpu(self, gpu_index: int) -> None:
        """The GPU falls off the bus: its queued work is dropped and every call on it raises GpuLost."""

        def body(gpu: GpuState, _now: float) -> None:
            gpu.lost = True
            gpu.head_seq += gpu.queued_segments
            gpu.queue = gpu.queue[:0]
            gpu.head = None
            gpu.marks = {k: v for k, v in gpu.marks.items() if v is not None}  # that work never ends

        self.update(gpu_index, None, body)

    def recover_gpu(self, gpu_index: int) -> None:
        """The lost GPU is back (its settings and counter as they were)."""

        def body(gpu: GpuState, _now: float) -> None:
            gpu.lost = False

        self.update(gpu_index, None, body)

    def reset_energy_counter(self, gpu_index: int) -> None:
        """A driver reload: the energy counter restarts from zero (the true energy integral does not)."""

        def body(gpu: GpuState, _now: float) -> None:
            gpu.counter_base_mj = -1000.0 * gpu.energy_j

        self.update(gpu_index, None, body)

    # ---- ground truth --------------------------------------------------------------------------------

    def true_energy_j(self, gpu_index: int) -> float:
        """The exact energy integral of GPU ``gpu_index`` since the device was created (no quantisation)."""
        return self.read(gpu_index, None, _energy_j)

    def now_s(self) -> float:
        """Simulated time now."""
        return self.clock.now_s()

    def draw_noise(self, gpu_index: int, count: int) -> tuple[FloatArray, FloatArray]:
        """Log-normal duration and power noise factors (median 1, σ from the profile), seeded per GPU."""
        self.check_index(gpu_index)
        rng = self._rngs[gpu_index]
        duration = np.exp(rng.normal(0.0, self.profile.noise_duration, count))
        power = np.exp(rng.normal(0.0, self.profile.noise_power, count))
        return duration, power

    # ---- GPU work (the simulated worker's side) ------------------------------------------------------

    def segment_rows(
        self,
        compute_mhz_s: ArrayLike,
        memory_s: ArrayLike,
        mem_activity_scale: ArrayLike = 1.0,
        noise_duration: ArrayLike | None = None,
        noise_power: ArrayLike | None = None,
    ) -> FloatArray:
        """Queue rows for these segments (validated; each with its power-limited clock)."""
        compute = np.atleast_1d(np.asarray(compute_mhz_s, dtype=np.float64))
        count = compute.shape[0]
        if compute.ndim != 1:
            raise InvalidArgument("compute_mhz_s: expected one value per segment")
        columns = [
            compute,
            segment_column(memory_s, count, 0.0, "memory_s"),
            segment_column(mem_activity_scale, count, 1.0, "mem_activity_scale"),
            segment_column(noise_duration, count, 1.0, "noise_duration"),
            segment_column(noise_power, count, 1.0, "noise_power"),
        ]
        rows = np.column_stack([*columns, np.zeros(count)]) if count else np.zeros((0, len(QUEUE_COLUMNS)))
        if not np.all(np.isfinite(rows)) or np.any(rows < 0) or np.any(rows[:, 3:5] == 0):
            raise InvalidArgument("segments: work must be finite and ≥ 0, noise factors finite and > 0")
        if np.any((rows[:, 0] == 0) & (rows[:, 1] == 0)):
            raise InvalidArgument("segments: a segment needs compute or memory work")
        rows[:, -1] = self.model.power_limited_clocks_mhz(rows) if count else 0.0
        return rows

    def run_segments(  # noqa: PLR0917 - positional segment arrays, as the workload produces them
        self,
        gpu_index: int,
        compute_mhz_s: ArrayLike,
        memory_s: ArrayLike,
        mem_activity_scale: ArrayLike = 1.0,
        noise_duration: ArrayLike | None = None,
        noise_power: ArrayLike | None = None,
        *,
        sleep: bool = True,
    ) -> WorkResult:
        """Execute segments on GPU ``gpu_index`` back to back, starting now (or when its queued work ends).

        Each segment runs at the clock that holds when it starts and follows physics.py times the given
        noise factors (None: no noise). With ``sleep`` (default) the call waits on the clock until the
        work is done — ``duration / speedup`` wall seconds in real time, an advance of a virtual clock —
        keeping about ``LOOKAHEAD_WALL_S`` of work queued, and returns the exact result. With
        ``sleep=False`` all the work is queued at once and the call returns a forecast
        (``final=False``) that assumes the clocks stay as they are; :meth:`wait` gives the real result
        of a :meth:`submit_segments` ticket.
        """
        rows = self.segment_rows(compute_mhz_s, memory_s, mem_activity_scale, noise_duration, noise_power)
        self.check_faults(gpu_index, "run_segments")
        if rows.shape[0] == 0:
            now = self.clock.now_s()
            return WorkResult(gpu_index, 0, now, now, 0.0)
        if not sleep:
            return self._forecast(self._submit(gpu_index, rows))
        return self._run(gpu_index, rows)

    def submit_segments(  # noqa: PLR0917 - same arguments as run_segments
        self,
        gpu_index: int,
        compute_mhz_s: ArrayLike,
        memory_s: ArrayLike,
        mem_activity_scale: ArrayLike = 1.0,
        noise_duration: ArrayLike | None = None,
        noise_power: ArrayLike | None = None,
    ) -> WorkTicket:
        """Queue all the segments at once and return at once (collect with :meth:`poll` or :meth:`wait`)."""
        rows = self.segment_rows(compute_mhz_s, memory_s, mem_activity_scale, noise_duration, noise_power)
        self.check_faults(gpu_index, "run_segments")
        if rows.shape[0] == 0:
            raise InvalidArgument("segments: nothing to submit")
        return self._submit(gpu_index, rows)

    def poll(self, ticket: WorkTicket) -> WorkResult | None:
        """The result of submitted work if it has finished by now, else None."""
        return self._collect(ticket)[0]

    def wait(self, ticket: WorkTicket) -> WorkResult:
        """Wait on the clock until submitted work finishes; its result."""
        while True:
            result, remaining_s = self._collect(ticket)
            if result is not None:
                return result
            self.clock.sleep_s(self._wait_s(remaining_s))

    def _submit(self, index: int, rows: FloatArray) -> WorkTicket:
        def body(gpu: GpuState, now: float) -> WorkTicket:
            _require_alive(gpu, index)
            first = gpu.next_seq
            gpu.queue = np.vstack([gpu.queue, rows])
            last = gpu.next_seq - 1
            prune_marks(gpu, now)
            gpu.marks[f"s{first}"] = None
            gpu.marks[f"e{last}"] = None
            return WorkTicket(index, first, last, int(rows.shape[0]))

        return self.update(index, None, body)

    def _collect(self, ticket: WorkTicket) -> tuple[WorkResult | None, float]:
        def body(gpu: GpuState, _now: float) -> tuple[WorkResult | None, float]:
            _require_alive(gpu, ticket.gpu_index)
            return take_result(gpu, ticket), self.model.remaining_s(gpu)

        return self.update(ticket.gpu_index, None, body)

    def _forecast(self, ticket: WorkTicket) -> WorkResult:
        gpu = self.observe(ticket.gpu_index)
        for _ in range(100):
            result = take_result(gpu, ticket)
            if result is not None:
                return WorkResult(
                    result.gpu_index,
                    result.segments,
                    result.start_s,
                    result.end_s,
                    result.energy_j,
                    final=False,
                )
            self.model.advance(gpu, gpu.time_s + self.model.remaining_s(gpu) + 1e-9)
        raise BackendFailure("sim: forecast did not converge")  # pragma: no cover - defensive

    def _wait_s(self, remaining_s: float) -> float:
        cap = MAX_WAIT_WALL_S * self.clock.speedup
        return min(cap, remaining_s + 1e-9)

    def _run(self, index: int, rows: FloatArray) -> WorkResult:
        total = int(rows.shape[0])
        lookahead_s = LOOKAHEAD_WALL_S * self.clock.speedup
        state = _RunState()

        def body(gpu: GpuState, now: float) -> tuple[WorkResult | None, float]:
            _require_alive(gpu, index)
            if state.submitted < total:
                take = self._chunk(gpu, rows[state.submitted :], lookahead_s)
                if take:
                    first = gpu.next_seq
                    gpu.queue = np.vstack([gpu.queue, rows[state.submitted : state.submitted + take]])
                    if state.submitted == 0:
                        prune_marks(gpu, now)
                        state.first_seq = first
                        gpu.marks[f"s{first}"] = None
                    state.submitted += take
                    if state.submitted == total:
                        state.last_seq = gpu.next_seq - 1
                        gpu.marks[f"e{state.last_seq}"] = None
                return None, self.model.remaining_s(gpu)
            ticket = WorkTicket(index, state.first_seq, state.last_seq, total)
            return take_result(gpu, ticket), self.model.remaining_s(gpu)

        while True:
            result, remaining_s = self.update(index, None, body)
            if result is not None:
                return result
            if state.submitted < total:
                # Refill while about half the lookahead (or half the capped queue) is still queued.
                wait_s = min(self._wait_s(remaining_s), max(remaining_s / 2, remaining_s - lookahead_s / 2))
            else:
                wait_s = self._wait_s(remaining_s)
            self.clock.sleep_s(wait_s)

    def _chunk(self, gpu: GpuState, rows: FloatArray, lookahead_s: float) -> int:
        """How many of ``rows`` to queue now: enough for the lookahead, within the queue cap."""
        room = min(QUEUE_CAP_SEGMENTS - gpu.queued_segments, rows.shape[0])
        if room <= 0:
            return 0
        if math.isinf(lookahead_s):
            return int(room)
        wanted_s = lookahead_s - self.model.remaining_s(gpu)
        if wanted_s <= 0:
            return 0
        cap = gpu.pending.cap_mhz if gpu.pending is not None else gpu.cap_mhz
        ends = np.cumsum(self.model.price(rows[:room], cap).duration_s)
        return min(int(room), int(np.searchsorted(ends, wanted_s, side="left")) + 1)


@dataclass(slots=True)
class _RunState:
    submitted: int = 0
    first_seq: int = -1
    last_seq: int = -1


def _energy_j(gpu: GpuState) -> float:
    return gpu.energy_j


def _require_alive(gpu: GpuState, index: int) -> None:
    if gpu.lost:
        raise fault_error("GpuLost", index, "run_segments")
