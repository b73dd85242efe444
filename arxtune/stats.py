"""Summary statistics for per-iteration latency samples.

The median is reported with a distribution-free 95% confidence interval from
order statistics (no normality assumption: latency distributions are skewed
and heavy-tailed). Calibration compares these intervals.
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
    median_us: float
    p10_us: float
    p90_us: float
    ci_low_us: float
    ci_high_us: float
    unstable: bool


def median_ci_ranks(n: int, z: float = 1.96) -> tuple[int, int]:
    """0-based order-statistic ranks bounding the median with ~95% confidence."""
    half = z * math.sqrt(n) / 2
    low = max(0, int(math.floor(n / 2 - half)))
    high = min(n - 1, int(math.ceil(n / 2 + half)))
    return low, high


def summarize(samples_us) -> Summary:
    values = np.sort(np.asarray(samples_us, dtype=np.float64))
    if values.size == 0:
        raise ValueError("no samples")
    median = float(np.median(values))
    p10, p90 = (float(v) for v in np.percentile(values, [10, 90]))
    low, high = median_ci_ranks(values.size)
    ci_low, ci_high = float(values[low]), float(values[high])
    unstable = values.size < 5 or (p90 - p10) > UNSTABLE_SPREAD * median or (ci_high - ci_low) > UNSTABLE_CI * median
    return Summary(int(values.size), median, p10, p90, ci_low, ci_high, bool(unstable))


def bandwidths(nbytes: int, seconds: float, bus_factor: float) -> tuple[float, float]:
    """(algbw, busbw) in GB/s, nccl-tests style."""
    algbw = nbytes / seconds / 1e9
    return algbw, algbw * bus_factor
