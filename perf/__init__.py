"""eerl's benchmarks (``make bench``, ``python -m perf``): figures for people, never asserted in tests.

Each benchmark is its own module, run from the repository root with ``python -m perf.NAME`` (the
``eerl-bench`` command, the virtual-time comparison of controllers, is :mod:`eerl_sim.bench`):

- :mod:`perf.phase_latency`: BeginPhase + EndPhase round trip against a no-op gRPC floor, SIGKILL to reset;
- :mod:`perf.echo_server`: that floor, a no-op gRPC server;
- :mod:`perf.daemon_variant`: eerld with parts of its work taken out, to see where the time goes;
- :mod:`perf.client_overhead`: what one phase event costs the training thread;
- :mod:`perf.sim_speed`: how fast the simulator runs;
- :mod:`perf.real_gpu`: a read-only check of the whole daemon on a real GPU;
- :mod:`perf.stats`: the one nearest-rank quantile they all report.

Committed figures are in ``docs/results/``; the reliability soak (``make soak``) is :mod:`soak`.
"""
