"""Hooks that put an RL framework's phases into an eerl session.

Each framework has its own module, imported only when asked for (the frameworks are optional):
``eerl.integrations.trl``, ``eerl.integrations.verl``, ``eerl.integrations.openrlhf``. Each offers
``instrument(trainer, session)``, which wraps the trainer's generation and optimisation steps on that
one trainer object, and returns a handle whose ``remove()`` undoes it. A hook that finds nothing it knows
how to wrap says so with a :class:`HookWarning` naming the framework's version; inside the training loop
a hook never raises. See ``docs/integrations.md``.
"""

from eerl.integrations._common import HookWarning, framework_version

__all__ = ["HookWarning", "framework_version"]
