"""Hooks that put an RL framework's phases into an eerl session.

Each framework has its own module, imported only when asked for (the frameworks are optional):
``eerl.integrations.trl``, ``eerl.integrations.verl``, ``eerl.integrations.openrlhf``. Each offers
``instrument(trainer, session)``, which wraps the trainer's generation and optimisation steps on that
one trainer object, and returns a handle whose ``remove()`` undoes it. See ``docs/integrations.md``.
"""
