"""eerl-sim: the simulated GPU and RL workload of docs/simulator.md (the shared sim-model spec).

A distribution of its own, above eerld's GPU protocol: :mod:`eerl_sim.gpu` is the ``sim`` backend (which
``eerld --backend sim`` loads by name), the modules here are the world model it follows (physics, profiles,
workload, scenarios, nodes, meter, the virtual-time evaluator, the sweep), and :mod:`eerl_sim.bench` is
``eerl-bench``.
"""
