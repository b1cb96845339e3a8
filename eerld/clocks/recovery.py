"""``eerld --reset-clocks``: the last resort (systemd's ExecStopPost, a Slurm epilog) resets the whole node.

It depends on nothing that may have failed: every GPU of the node is reset (SM lock, application clocks,
memory lock: :func:`~eerld.clocks.arbiter.reset_gpu_clocks`), in parallel, whatever the ledger says; only
then is the ledger looked at. A corrupt ledger is set aside (``ledger.json.corrupt-<unix time>``, one log
line) and replaced by one that lists exactly the GPUs whose reset failed, so that the next start resets them
again; a state directory that is not root's own is left untouched and reported.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass
from pathlib import Path

import structlog

from eerld import files
from eerld.clocks.arbiter import (
    APPLY_TIMEOUT_S,
    AppliedClock,
    ClockSource,
    error_reason,
    locks_work_on,
    reset_gpu_clocks,
)
from eerld.clocks.ledger import Ledger, LedgerEntry
from eerld.errors import ConfigError, GpuError
from eerld.gpu.base import GpuBackend, GpuIdentity

log = structlog.get_logger("eerld.clocks")


@dataclass(frozen=True, slots=True)
class NodeReset:
    """What ``--reset-clocks`` did."""

    clocks: tuple[AppliedClock, ...]
    """One per GPU of the node; ``degraded_reason`` names a GPU whose reset failed."""
    state_dir_error: str = ""
    """Why the ledger was left alone (a state directory another user controls); "" when it was tidied."""

    @property
    def failed(self) -> tuple[AppliedClock, ...]:
        """The GPUs whose reset failed."""
        return tuple(c for c in self.clocks if c.degraded_reason)


def _reset_one(backend: GpuBackend, identity: GpuIdentity) -> AppliedClock:
    reason = ""
    try:
        reset_gpu_clocks(backend, identity.index, locks_work=locks_work_on(backend, identity.index))
    except GpuError as e:
        reason = error_reason(e)
    read_back = 0
    try:
        read_back = backend.clocks(identity.index).sm_clock_mhz
    except GpuError as e:
        reason = reason or error_reason(e)
    if reason:
        log.error("clock_reset_failed", gpu_index=identity.index, gpu_uuid=identity.uuid, reason=reason)
    else:
        log.info("clock_reset", gpu_index=identity.index, gpu_uuid=identity.uuid, reason="--reset-clocks")
    return AppliedClock(identity.index, identity.uuid, read_back, None, ClockSource.DEFAULT, False, reason)


def reset_gpus(
    backend: GpuBackend, *, timeout_s: float = APPLY_TIMEOUT_S, max_workers: int = 8
) -> list[AppliedClock]:
    """Reset every GPU of the node in parallel; a GPU hanging past ``timeout_s`` is reported, not awaited."""
    identities = list(backend.inventory())
    if not identities:
        return []
    pool = ThreadPoolExecutor(max_workers=min(max_workers, len(identities)), thread_name_prefix="eerld-reset")
    try:
        futures = [pool.submit(_reset_one, backend, identity) for identity in identities]
        wait_futures(futures, timeout=timeout_s)
        results: list[AppliedClock] = []
        for identity, future in zip(identities, futures, strict=True):
            if future.done() and future.exception() is None:
                results.append(future.result())
            else:
                reason = "backend call timed out" if not future.done() else f"{future.exception()!r}"
                log.error("clock_reset_failed", gpu_index=identity.index, reason=reason)
                results.append(
                    AppliedClock(identity.index, identity.uuid, 0, None, ClockSource.DEFAULT, False, reason)
                )
        return results
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def tidy_ledger(state_dir: Path, failed: list[AppliedClock]) -> None:
    """After a node reset: set a corrupt ledger aside and list exactly the GPUs whose reset ``failed``.

    ConfigError for a state directory that is not root's own (left untouched); a write that fails (a full
    disk) is logged and leaves the old ledger, which names at most GPUs already reset (harmless).
    """
    files.ensure_private_dir(state_dir, "--state-dir")
    ledger = Ledger(state_dir)
    if ledger.corrupt:
        try:
            ledger.set_aside()
        except OSError as e:
            log.warning("ledger_set_aside_failed", path=str(ledger.path), reason=e.strerror or str(e))
    try:
        ledger.replace(LedgerEntry(c.index, c.uuid, "reset-failed") for c in failed)
    except OSError as e:
        log.warning("ledger_write_failed", path=str(ledger.path), reason=e.strerror or str(e))


def reset_node(backend: GpuBackend, state_dir: Path) -> NodeReset:
    """Reset every GPU of the node whatever the ledger says, then tidy the ledger (``--reset-clocks``)."""
    clocks = reset_gpus(backend)
    try:
        tidy_ledger(state_dir, [c for c in clocks if c.degraded_reason])
    except ConfigError as e:
        log.error("ledger_left_alone", state_dir=str(state_dir), reason=str(e))
        return NodeReset(tuple(clocks), str(e))
    return NodeReset(tuple(clocks))
