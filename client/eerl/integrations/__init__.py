"""Hooks that put an RL framework's phases into an eerl session.

Each framework has its own module, imported only when asked for (the frameworks are optional):
``eerl.integrations.trl``, ``eerl.integrations.verl``, ``eerl.integrations.openrlhf``. Each offers
``instrument(trainer, session)``, which wraps the trainer's generation and optimisation steps on that
one trainer object, and returns a handle whose ``remove()`` undoes it. A hook that finds nothing it knows
how to wrap says so with a :class:`HookWarning` naming the framework's version; inside the training loop
a hook never raises. See ``docs/integrations.md``.

A hook of your own reports a generation phase's ``max_worker_kv_tokens`` with :func:`decode_reads` (one
worker's responses) or :func:`busiest_decode_reads` (each worker's), each decode step's weight read from
:func:`model_step_reads` of your model (or :data:`DEFAULT_STEP_READS`).
"""

from eerl.integrations._common import HookWarning, framework_version
from eerl.integrations._counting import (
    DEFAULT_STEP_READS,
    busiest_decode_reads,
    decode_reads,
    model_step_reads,
    step_reads,
)

__all__ = [
    "DEFAULT_STEP_READS",
    "HookWarning",
    "busiest_decode_reads",
    "decode_reads",
    "framework_version",
    "model_step_reads",
    "step_reads",
]
