"""Summary statistics for latency samples gathered in rounds.

A point is timed in several rounds interleaved with the other backends (see
sweep.py). The median is pooled over every sample; its interval comes from
the spread across rounds, because drift between rounds (other load, clocks,
caches) is far larger than the scatter inside one block of back-to-back
iterations. With R rounds the range of the per-round medians covers the
median of round medians with probability 1 - 2^(1-R) (94% at 5 rounds), with
no assumption about the distribution. A point with a single round falls back
to the order-statistic interval of its samples.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

#: A point is unstable when its p10-p90 spread exceeds this fraction of the median.
UNSTABLE_SPREAD = 0.5
#: ... or when its median's interval is wider than this fraction of the median.
UNSTABLE_CI = 0.2


@dataclass(frozen=True)
class Summary:
    n: int
    rounds: int
    median_us: float
    p10_us: float
    p90_us: float
    p99_us: float
    ci_low_us: float
    ci_high_us: float
    unstable: bool
    round_medians_us: tuple[float, ...] = ()  # in the order the rounds ran


def median_ci_ranks(n: int, z: float = 1.96) -> tuple[int, int]:
    """0-based order-statistic ranks bounding the median with ~95% confidence."""
    half = z * math.sqrt(n) / 2
    low = max(0, int(math.floor(n / 2 - half)))
    high = min(n - 1, int(math.ceil(n / 2 + half)))
    return low, high


def split_rounds(samples_us, round_lengths) -> list[np.ndarray]:
    """The flat sample list cut into its rounds (one round when no lengths are given)."""
    values = np.asarray(samples_us, dtype=np.float64)
    if not round_lengths:
        return [values]
    if sum(round_lengths) != values.size:
        raise ValueError(f"round lengths {list(round_lengths)} do not add up to {values.size} samples")
    return np.split(values, np.cumsum(round_lengths)[:-1])


def round_medians(samples_us, round_lengths=()) -> list[float]:
    """The median of each non-empty round, in the order the rounds ran."""
    return [float(np.median(r)) for r in split_rounds(samples_us, round_lengths) if r.size]


def summarize(samples_us, round_lengths=()) -> Summary:
    values = np.sort(np.asarray(samples_us, dtype=np.float64))
    if values.size == 0:
        raise ValueError("no samples")
    median = float(np.median(values))
    p10, p90, p99 = (float(v) for v in np.percentile(values, [10, 90, 99]))
    medians = round_medians(samples_us, round_lengths)
    if len(medians) >= 2:
        ci_low, ci_high = min(medians), max(medians)
    else:
        low, high = median_ci_ranks(values.size)
        ci_low, ci_high = float(values[low]), float(values[high])
    unstable = values.size < 5 or (p90 - p10) > UNSTABLE_SPREAD * median or (ci_high - ci_low) > UNSTABLE_CI * median
    return Summary(int(values.size), len(medians), median, p10, p90, p99, ci_low, ci_high, bool(unstable), tuple(medians))


def bandwidths(nbytes: int, seconds: float, bus_factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, nccl-tests style."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor
