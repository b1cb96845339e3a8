"""The live demo (``make demo``, ``python -m demo``): the real eerld steering a simulated RL job, live.

Not part of the daemon's wheel: a tool of this repository, run from its root. One module per job:

- :mod:`demo.cli`: the command line (``python -m demo``);
- :mod:`demo.live`: the orchestration: start eerld and the worker, follow them, stop them, check the GPUs;
- :mod:`demo.daemon`: the daemon process (``python -m demo.daemon``, eerld on a sim backend without fsync);
- :mod:`demo.worker`: the simulated RL worker (``python -m demo.worker``);
- :mod:`demo.record`: what the demo records (each phase beside the default governor's prediction);
- :mod:`demo.report`: the per-phase lines and the summary;
- :mod:`demo.plot`: the timeline plot.
- :mod:`demo.multinode`: ``make demo-multinode``, the same on a local Ray cluster of simulated nodes, driven
  through :class:`eerl.ray.RayJob` (docs/multinode.md).

It reads the controller's view through eerlctl's admin client (:mod:`eerlctl.client`). docs/demo.md
explains the output.
"""
