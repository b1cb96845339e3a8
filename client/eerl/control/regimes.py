"""Regime memory: what a kind learned about a workload regime, kept for when that regime returns.

Jobs often come back to a workload they ran before: data mixed in blocks (short answers, then long math,
then short answers again), a curriculum that returns to an earlier stage, evaluation batches. Without a
memory every return is a new regime: default phases to re-learn the baseline, then trials to re-tune —
on a job whose regimes alternate every 30 iterations that is most of each block. So when the monitor sees
a workload step, the regime being left is kept (its predictor, its clock curve, its commit and the typical
cost of its phases) under its *signature*, the mean of its watched workload features over its newest
default phases. When a step lands on a workload whose signature matches a kept one on every watched
feature (within half the step band: two regimes closer than that are one regime), the kind takes that
regime up again — committed at its clock at once, its control phases and refines going on from where
their counts stood when the regime was left (a control phase that misses, or committed phases whose
ratios leave their band, re-baseline it as any regime). A control phase at every return, to check the
kept predictor, was 1 of every 15–30 phases of a job switching that often, each a phase at the default
governor; the regime's own cadence checks it as often as any regime. A regime left
before its search committed (blocks shorter than a search) takes its search up again, on the trials it
had, after one default phase that checks its predictor.

A regime is kept by copy: the live predictor and curve go on learning; the kept one is what the kind knew
when it left. At most :data:`KEPT_REGIMES` per kind, the least recently left going first.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from eerl.control.curve import ClockCurve
from eerl.control.predictor import BaselinePredictor

FloatArray = npt.NDArray[np.float64]

KEPT_REGIMES = 4
"""Regimes kept per kind (each about the size of one predictor and one curve: tens of KiB)."""


@dataclass(slots=True, eq=False)
class Regime:
    """One workload regime as a kind knew it when the workload stepped away from it."""

    signature: FloatArray
    """The watched workload features' means over the regime's newest default phases."""
    predictor: BaselinePredictor
    curve: ClockCurve
    default_duration_s: float
    default_energy_j: float
    committed_mhz: int | None
    committed_ratios: tuple[float, float]
    left_iteration: int
    signature_spread: FloatArray | None = None
    """The watched features' relative spread over its window: a regime whose batches vary more is
    recognised within a wider band (one phase's signature is one batch)."""
    since_refine: int = 0
    """Committed phases since the regime's last refine when it was left: its refine cadence goes on from
    there on return (blocks shorter than a refine interval would otherwise never refine)."""
    since_control: int = 0
    """Committed phases since the regime's last control phase when it was left: likewise its control
    cadence."""
    search_epoch: int | None = None
    """Left while searching: its search's epoch (the trials from then on counted towards its commit);
    None: left committed."""


@dataclass(slots=True)
class RegimeMemory:
    """The regimes a kind has left, most recently left last."""

    regimes: deque[Regime] = field(default_factory=lambda: deque(maxlen=KEPT_REGIMES))

    def keep(self, regime: Regime, band: float) -> None:
        """Keep ``regime``, replacing a kept one it matches (the newer knowledge of the same regime)."""
        kept = [old for old in self.regimes if not signatures_match(old.signature, regime.signature, band)]
        self.regimes.clear()
        self.regimes.extend([*kept, regime])

    def recall(self, signature: FloatArray, band: float) -> Regime | None:
        """The most recently left regime whose signature matches, if any (it leaves the memory)."""
        for index in range(len(self.regimes) - 1, -1, -1):
            regime = self.regimes[index]
            if signatures_match(regime.signature, signature, band, regime.signature_spread):
                del self.regimes[index]
                return regime
        return None


SIGNATURE_SPREADS = 2.5
"""A step lands on a kept regime within this many of the regime's own batch spread (or the band)."""


def signatures_match(
    kept: FloatArray, seen: FloatArray, band: float, spread: FloatArray | None = None
) -> bool:
    """Every watched feature within ×(1 + ``band``) of the kept one's, either way — wider where the kept
    regime's batches spread more (``spread``, relative: a step's signature may be a single batch; on
    `four-regimes-a100` training, whose prompts with differing rewards vary, missed its kept regime on
    two returns of four); a feature 0 in either is moot."""
    widths = (
        [band] * len(kept) if spread is None else [max(band, SIGNATURE_SPREADS * float(x)) for x in spread]
    )
    pairs = [(float(k), float(s), w) for k, s, w in zip(kept, seen, widths, strict=True) if k > 0 and s > 0]
    # math.log, not NumPy's: its SIMD kernels differ by CPU in the last bit (eerl.control.numeric).
    return bool(pairs) and all(abs(math.log(s / k)) <= math.log1p(w) for k, s, w in pairs)


def snapshot_regime(
    signature: FloatArray,
    predictor: BaselinePredictor,
    curve: ClockCurve,
    *,
    default_duration_s: float,
    default_energy_j: float,
    committed_mhz: int | None,
    committed_ratios: tuple[float, float],
    iteration: int,
    search_epoch: int | None = None,
    signature_spread: FloatArray | None = None,
    since_refine: int = 0,
    since_control: int = 0,
) -> Regime:
    """A copy of what a kind knows now (predictor and curve copied together: the curve reads its ratios
    through the predictor, and the copy must keep reading through the copied one)."""
    kept_predictor, kept_curve = copy.deepcopy((predictor, curve))
    return Regime(
        signature=np.array(signature, dtype=np.float64),
        predictor=kept_predictor,
        curve=kept_curve,
        default_duration_s=default_duration_s,
        default_energy_j=default_energy_j,
        committed_mhz=committed_mhz,
        committed_ratios=committed_ratios,
        left_iteration=iteration,
        search_epoch=search_epoch,
        signature_spread=signature_spread,
        since_refine=since_refine,
        since_control=since_control,
    )
