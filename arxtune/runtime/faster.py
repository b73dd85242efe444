"""Whether one backend is clearly faster than another at one size: the rule calibrate (arxtune.harness.winners) and the start-up ladder share.

A challenger beats the baseline at one size only clearly: its pooled median
beats the baseline's by more than `margin`, and so do most paired rounds
(the backends take turns within a round, so drift between rounds cancels):
the median over rounds of its time over the baseline's in the same round,
and, for the win not to rest on a round or two, at least `rounds_needed(n)`
of the n rounds (the exact one-sided sign test: a true tie wins that many
rounds at most one time in ten). A near-tie is therefore a tie, and the baseline
keeps it. Without paired rounds, the challenger's interval must lie wholly
below the baseline's.

`undecided` says where more rounds could still change the answer; the sweep
and the ladder take extra rounds there, within their bounds.
Pure Python: a serving process imports no pandas or numpy for it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

#: The margin a challenger must win by when no file or command gives one (calibrate's default).
DEFAULT_MARGIN = 0.05
#: A ratio within this factor of the margin's edge is close: more rounds may move it across.
CLOSE_BAND = 0.05
#: How often a true tie may pass the sign test over paired rounds (one-sided).
SIGN_ALPHA = 0.1


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


def rounds_needed(n: int) -> int:
    """Paired rounds (of n) a challenger must win for a clear win: the fewest a true tie reaches at most
    one time in ten (the exact one-sided sign test; 4 of 4, 5 of 5, 8 of 10, 11 of 15, 14 of 20)."""
    tail = 0
    for k in range(n, -1, -1):
        tail += math.comb(n, k)
        if tail / 2**n > SIGN_ALPHA:
            return min(n, k + 1)
    return n


def _ratios(challenger: PointTimes, base: PointTimes) -> list[float] | None:
    mine, theirs = challenger.round_medians_us, base.round_medians_us
    if len(mine) >= 2 and len(mine) == len(theirs) and min(theirs) > 0:
        return [m / t for m, t in zip(mine, theirs)]
    return None


def clearly_faster(challenger: PointTimes, base: PointTimes, margin: float) -> bool:
    """Whether `challenger` beats `base` at the same size with confidence (the rule above)."""
    edge = 1 / (1 + margin)
    if not challenger.median_us < base.median_us * edge:
        return False
    ratios = _ratios(challenger, base)
    if ratios is None:
        return challenger.ci_high_us < base.ci_low_us
    wins = sum(r < edge for r in ratios)
    return statistics.median(ratios) < edge and wins >= rounds_needed(len(ratios))


def undecided(challenger: PointTimes, base: PointTimes, margin: float, band: float = CLOSE_BAND) -> bool:
    """Whether more paired rounds could change `clearly_faster`'s answer: the pooled or the paired
    median ratio lies within `band` of the margin's edge, the two disagree, or the rounds that beat
    the edge are neither clearly few nor enough (between a third of the rounds and the count needed)."""
    edge = 1 / (1 + margin)
    near = lambda r: edge / (1 + band) <= r <= edge * (1 + band)  # noqa: E731
    if base.median_us > 0 and near(challenger.median_us / base.median_us):
        return True
    ratios = _ratios(challenger, base)
    if ratios is None:
        return False
    wins, paired = sum(r < edge for r in ratios), statistics.median(ratios)
    split = (challenger.median_us < base.median_us * edge) != (paired < edge)
    return near(paired) or split or len(ratios) / 3 < wins < rounds_needed(len(ratios))
