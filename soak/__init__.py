"""The reliability soak (``make soak``, ``python -m soak``): docs/reliability.md's promises, with figures.

Each section is a module the soak runs at full size and tests/reliability runs at small counts
(``from soak import load``), run from the repository root:

- :mod:`soak.load`: many client processes' phase events, nothing lost or misattributed;
- :mod:`soak.kills`: clients, the daemon and ledger writers SIGKILLed;
- :mod:`soak.faults`: every typed backend error at every backend call site; an energy counter reset;
- :mod:`soak.fuzz`: a hypothesis fuzz of every RPC;
- :mod:`soak.exhaust`: resource exhaustion from outside (``python -m soak.exhaust``);

and what they share: :mod:`soak.daemon` (a real eerld process and the outside view of it),
:mod:`soak.worker` (a simulated RL worker process on the real client), :mod:`soak.proc` (a process's
costs from ``/proc``). Latency figures use the benchmarks' quantile and echo floor (:mod:`perf`).
"""
