"""Clock controllers: pure logic that turns phase observations into per-phase clock decisions.

The same objects run in eerld (one per session, in real time), in ``eerl-bench`` (virtual time) and, needing
no daemon, inside an RL job. The package imports nothing from eerld; its nouns (phase kinds, workloads,
controller states) are :mod:`eerl.phases`. ``base`` and ``clocks`` need only the standard library; the
learning parts need numpy: ``pip install 'eerl-client[control]'``. ``import eerl`` never imports this package.

The EE-RL controller (``eerl``) is a thin coordinator over its parts: ``baseline`` (the predictor under the
default governor), ``search`` (the next trial, the exploration bounds), ``plan`` (the budget across phases),
``slack`` (async slack), ``commit``, ``monitor`` (control phases, drift) and ``retune`` (refine, re-tunes),
each over the records of ``state`` it owns, with ``grid`` (the clock grid) and ``config`` (the tuning). They
build on ``predictor``, ``curve`` and ``budget``; ``registry`` names the controllers.
"""
