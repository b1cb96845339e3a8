"""The ``sim`` GPU backend: simulated GPUs behind the same protocol as NVML (:mod:`eerld.gpu.base`).

One module per job (docs/sim-backend.md):

- :mod:`~eerld.gpu.sim.backend`: :class:`SimBackend` (the backend protocol), :func:`create_sim_backend`,
  :func:`open_sim_device`;
- :mod:`~eerld.gpu.sim.device`: :class:`SimDevice`, the device shared by the daemon and simulated workers
  (GPU work, fault injection, ground truth);
- :mod:`~eerld.gpu.sim.model`: the pure state transitions (run queued segments up to a time, measure);
- :mod:`~eerld.gpu.sim.store`: where the state lives (memory, or a state file under ``flock``);
- :mod:`~eerld.gpu.sim.clock`: simulated time (:class:`VirtualClock`, :class:`RealTimeClock`).

The world model the simulated GPUs follow (physics, profiles, workload, scenarios) is :mod:`eerld.sim`.
"""

from eerld.gpu.sim.backend import SimBackend, create_sim_backend, open_sim_device
from eerld.gpu.sim.clock import RealTimeClock, SimClock, VirtualClock
from eerld.gpu.sim.device import FAULTABLE_METHODS, INJECTABLE_ERRORS, SimDevice, WorkResult, WorkTicket

__all__ = [
    "FAULTABLE_METHODS",
    "INJECTABLE_ERRORS",
    "RealTimeClock",
    "SimBackend",
    "SimClock",
    "SimDevice",
    "VirtualClock",
    "WorkResult",
    "WorkTicket",
    "create_sim_backend",
    "open_sim_device",
]
