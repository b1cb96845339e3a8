"""eerl-sim: the simulated GPU and RL workload of docs/simulator.md (the shared sim-model spec).

A distribution of its own, above eerld's GPU protocol: :mod:`eerl_sim.gpu` is the ``sim`` backend (which
``eerld --backend sim`` loads by name), the modules here are the world model it follows (physics, profiles,
workload, scenarios, nodes, meter, the virtual-time evaluator, the sweep), and :mod:`eerl_sim.bench` is
``eerl-bench``.
"""

from importlib.metadata import PackageNotFoundError as _PackageNotFoundError
from importlib.metadata import version as _version

try:
    __version__ = _version("eerl-sim")
except _PackageNotFoundError:  # pragma: no cover - running from a source tree without install
    __version__ = "0.0.0+unknown"
