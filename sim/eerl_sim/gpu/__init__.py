"""The ``sim`` GPU backend: simulated GPUs behind the same protocol as NVML (:mod:`eerld.gpu.base`).

One module per job (docs/sim-backend.md):

- :mod:`~eerl_sim.gpu.backend`: :class:`SimBackend` (the backend protocol), :func:`create_sim_backend`,
  :func:`create_daemon_backend` (what ``eerld --backend sim`` loads), :func:`open_sim_device`;
- :mod:`~eerl_sim.gpu.device`: :class:`SimDevice`, the device shared by the daemon and simulated workers
  (GPU work, fault injection, ground truth);
- :mod:`~eerl_sim.gpu.opening`: a fresh device's state, a stored one re-opened and checked;
- :mod:`~eerl_sim.gpu.work`: GPU work as workers see it (:class:`WorkTicket`, :class:`WorkResult`);
- :mod:`~eerl_sim.gpu.faults`: what can be injected where (``FAULTABLE_METHODS``, ``INJECTABLE_ERRORS``);
- :mod:`~eerl_sim.gpu.model`: the pure state transitions (run queued segments up to a time, measure);
- :mod:`~eerl_sim.gpu.state`: one GPU's state as data (queue, running segment, power history, settings);
- :mod:`~eerl_sim.gpu.store`: where the state lives (memory, or a state file under ``flock``);
- :mod:`~eerl_sim.gpu.clock`: simulated time (:class:`VirtualClock`, :class:`RealTimeClock`).

The world model the simulated GPUs follow (physics, profiles, workload, scenarios) is :mod:`eerl_sim`.
Of eerld this package imports only the GPU protocol (:mod:`eerld.gpu.base`) and the error tree.
"""

from eerl_sim.gpu.backend import SimBackend, create_daemon_backend, create_sim_backend, open_sim_device
from eerl_sim.gpu.clock import RealTimeClock, SimClock, VirtualClock
from eerl_sim.gpu.device import SimDevice
from eerl_sim.gpu.faults import FAULTABLE_METHODS, INJECTABLE_ERRORS
from eerl_sim.gpu.work import WorkResult, WorkTicket

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
    "create_daemon_backend",
    "create_sim_backend",
    "open_sim_device",
]
