"""What the daemon answers a session's phase events, as the job reads them (:meth:`eerl.Session.answer`)."""

from __future__ import annotations

from dataclasses import dataclass

from eerl.phases import ControllerState
from eerl.v1 import eerl_pb2
from eerl.wire.enums import STATE_FROM_PB

__all__ = ["GpuClockReading", "PhaseAnswer"]


@dataclass(frozen=True, slots=True)
class GpuClockReading:
    """One GPU's clock as the daemon read it back after applying a phase's decision."""

    index: int
    uuid: str
    sm_clock_mhz: int
    """What holds now."""
    requested_sm_clock_mhz: int
    """The lock requested; 0: the default governor."""
    source: str
    """Who decides the clock: ``default``, ``session`` or ``admin_pin`` (``""``: not said)."""


@dataclass(frozen=True, slots=True)
class PhaseAnswer:
    """The daemon's answer to one phase event of this session (:meth:`eerl.Session.answer`).

    For a begin: ``sm_clock_mhz`` is the clock the controller chose (0: the default governor), ``clocks``
    what each GPU holds now, ``resynced`` that an earlier phase was abandoned unmetered. For an end: the
    phase as the daemon metered it (``duration_s``, ``energy_j``, ``mean_power_w`` over ``gpus`` GPUs) and
    the clock that held over it. ``state``: the controller's state for the phase kind, None if not said.
    """

    begin: bool
    sm_clock_mhz: int
    state: ControllerState | None
    clocks: tuple[GpuClockReading, ...] = ()
    resynced: bool = False
    duration_s: float = 0.0
    energy_j: float = 0.0
    mean_power_w: float = 0.0
    gpus: int = 0
    simulated_time: bool = False
    """``duration_s`` is the simulator's accelerated time (eerld on simulated GPUs), not wall time."""

    @classmethod
    def from_begin(cls, reply: eerl_pb2.BeginPhaseResponse) -> PhaseAnswer:
        """The answer a ``BeginPhaseResponse`` carries."""
        return cls(
            begin=True,
            sm_clock_mhz=reply.target_sm_clock_mhz,
            state=STATE_FROM_PB.get(reply.state),
            clocks=tuple(
                GpuClockReading(
                    index=clock.index,
                    uuid=clock.uuid,
                    sm_clock_mhz=clock.sm_clock_mhz,
                    requested_sm_clock_mhz=clock.requested_sm_clock_mhz,
                    source=_source_name(clock.source),
                )
                for clock in reply.clocks
            ),
            resynced=reply.resynced,
        )

    @classmethod
    def from_end(cls, reply: eerl_pb2.EndPhaseResponse) -> PhaseAnswer:
        """The answer an ``EndPhaseResponse`` carries (energy in joules: the wire says millijoules)."""
        return cls(
            begin=False,
            sm_clock_mhz=reply.sm_clock_mhz,
            state=STATE_FROM_PB.get(reply.state),
            duration_s=reply.duration_s,
            energy_j=reply.energy_mj / 1000.0,
            mean_power_w=reply.mean_power_w,
            gpus=reply.gpus,
            simulated_time=reply.simulated_time,
        )


def _source_name(source: eerl_pb2.ClockSource.ValueType) -> str:
    """``default``, ``session`` or ``admin_pin`` for a ``ClockSource``; ``""`` for UNSPECIFIED or unknown."""
    if source == eerl_pb2.CLOCK_SOURCE_UNSPECIFIED:
        return ""
    try:
        return eerl_pb2.ClockSource.Name(source).removeprefix("CLOCK_SOURCE_").lower()
    except ValueError:
        return ""
