"""Clock controllers: pure logic that turns phase observations into per-phase clock decisions.

The same objects run in eerld (one per session, in real time), in ``eerl-bench`` (virtual time) and, needing
no daemon, inside an RL job. The package imports nothing from eerld; its nouns (phase kinds, workloads,
controller states) are :mod:`eerl.phases`. ``base`` and ``clocks`` need only the standard library; the
learning parts (``eerl``, ``predictor``, ``curve``, ``budget``, and ``registry``, which names them) need
numpy: ``pip install 'eerl-client[control]'``. ``import eerl`` never imports this package.
"""
