"""The per-point decision rule, shared by calibrate (arxtune.harness.decision) and the start-up ladder.

A challenger beats the baseline at one size only clearly: its pooled median
beats the baseline's by more than `margin`, and so does the median over
rounds of its time over the baseline's in the same round (the backends take
turns within a round, so drift between rounds cancels). Without paired
rounds, the challenger's interval must lie wholly below the baseline's.
Pure Python: a serving process imports no pandas or numpy for it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass


@dataclass(frozen=True)
class PointTimes:
    """What the rule needs of one backend at one size (microseconds)."""

    median_us: float
    round_medians_us: tuple[float, ...] = ()
    ci_low_us: float = 0.0
    ci_high_us: float = 0.0

    @classmethod
    def from_rounds(cls, rounds: list[list[float]] | tuple) -> "PointTimes":
        """Pooled median, per-round medians and their range (the interval, as harness.stats gives it)."""
        pooled = [s for r in rounds for s in r]
        if not pooled:
            raise ValueError("no samples")
        medians = tuple(statistics.median(r) for r in rounds if r)
        low, high = (min(medians), max(medians)) if len(medians) >= 2 else (min(pooled), max(pooled))
        return cls(statistics.median(pooled), medians, low, high)


def clearly_faster(challenger: PointTimes, base: PointTimes, margin: float) -> bool:
    """Whether `challenger` beats `base` at the same size with confidence (the rule above)."""
    if not challenger.median_us * (1 + margin) < base.median_us:
        return False
    mine, theirs = challenger.round_medians_us, base.round_medians_us
    if len(mine) >= 2 and len(mine) == len(theirs) and min(theirs) > 0:
        return statistics.median(m / t for m, t in zip(mine, theirs)) * (1 + margin) < 1
    return challenger.ci_high_us < base.ci_low_us
