"""A backend wrapper that can only observe: the hardware guarantee behind ``eerld --dry-run``.

Dry-run is the mode for nodes eerld must not touch (a first look at a production node, a shared
machine). The arbiter already skips actuation in dry-run; this wrapper makes the promise hold at the
last layer before the driver too, so no code path (ledger recovery, an admin reset, a retry) can lock or
reset a clock: every mutating call raises :class:`NoPermission` and reaches no GPU.
"""

from __future__ import annotations

from eerld.errors import NoPermission
from eerld.gpu.delegating import DelegatingBackend


class ObserveOnlyBackend(DelegatingBackend):
    """Delegates every read to the wrapped backend; refuses every clock change."""

    def lock_sm_clock(self, index: int, sm_clock_mhz: int) -> int:
        raise _refused("lock_sm_clock", index)

    def reset_sm_clock(self, index: int) -> None:
        raise _refused("reset_sm_clock", index)

    def lock_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        raise _refused("lock_mem_clock", index)

    def reset_mem_clock(self, index: int) -> None:
        raise _refused("reset_mem_clock", index)

    def set_application_clocks(self, index: int, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        raise _refused("set_application_clocks", index)

    def reset_application_clocks(self, index: int) -> None:
        raise _refused("reset_application_clocks", index)


def _refused(call: str, index: int) -> NoPermission:
    return NoPermission(f"dry-run: eerld never changes clocks ({call} refused)", gpu_index=index)
