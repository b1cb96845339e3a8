"""The quantised energy counter, the one rule both simulators follow (sim-model "Measurement").

A GPU's energy counter integrates its true power but advances only at steps ``period_s`` apart, at a fixed
offset of its own: a read at time ``t`` returns the true cumulative energy at the last step at or before
``t``. The simulated GPUs (:mod:`eerl_sim.gpu.model`, one GPU at a time, offset 0) and the benchmark's meter
(:mod:`eerl_sim.meter`, a pool at once) both ask this module where that step is.
"""

from __future__ import annotations

import math

import numpy as np

from eerl_sim.workload import FloatArray

__all__ = ["last_step_s", "last_steps_s"]


def last_step_s(time_s: float, period_s: float) -> float:
    """The last counter step at or before ``time_s`` of a counter stepping at multiples of ``period_s``."""
    return math.floor(time_s / period_s) * period_s


def last_steps_s(time_s: float, period_s: float, offsets_s: FloatArray) -> FloatArray:
    """Each counter's last step at or before ``time_s``, the counters stepping ``period_s`` apart from their
    own ``offsets_s`` (with offset 0 this is :func:`last_step_s`, to the last bit)."""
    return offsets_s + period_s * np.floor((time_s - offsets_s) / period_s)
