"""Do two runs of the same grid make the same choices? (`arxtune compare RUN_A RUN_B`)

Per point (op, dtype, view, size measured in both runs) each run's choice
comes from the measured decision rule (winners.py). The two agree when they
choose the same backend, or backends whose pooled medians (both runs'
samples together) are within `tolerance` of each other: either choice would
then serve as well. Regret is what a run's choice costs when judged by the
other run: its median there over the median of the other run's own choice,
minus one (0 where the two choose alike, and never below 0). The raw regret
beside it judges the choice against the fastest
median of the other run whatever that run chose: between two backends that
tie, it measures the noise of the medians, not the cost of a choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from arxtune.harness.winners import measured_winners
from arxtune.runtime.errors import ArxtuneError
from arxtune.harness.results import Run

DEFAULT_TOLERANCE = 0.05
#: Largest margin or tolerance: a backend 100 times slower still "within tolerance" is no comparison.
MAX_FRACTION = 100.0
KEYS = ["op", "dtype", "view", "nbytes"]


@dataclass(frozen=True)
class PointComparison:
    op: str
    dtype: str
    view: str
    nbytes: int
    choice_a: str
    choice_b: str
    pooled_ratio: float  # pooled median of choice_a over choice_b's
    regret_a: float  # A's choice judged by B's medians against B's choice
    regret_b: float  # B's choice judged by A's medians against A's choice
    agree: bool
    raw_regret_a: float = 0.0  # A's choice judged by B's medians against B's fastest
    raw_regret_b: float = 0.0


@dataclass(frozen=True)
class Comparison:
    points: tuple[PointComparison, ...]
    tolerance: float

    @property
    def agreement(self) -> float:
        return sum(p.agree for p in self.points) / len(self.points)

    @property
    def same_choice(self) -> int:
        return sum(p.choice_a == p.choice_b for p in self.points)

    def regrets(self, raw: bool = False) -> np.ndarray:
        pairs = ((p.raw_regret_a, p.raw_regret_b) if raw else (p.regret_a, p.regret_b) for p in self.points)
        return np.array([r for pair in pairs for r in pair])

    def summary(self) -> str:
        def spread(r: np.ndarray) -> str:  # NaN where a choice has no result in the other run
            if not np.isfinite(r).any():
                return "p50 nan, p90 nan, max nan"
            p50, p90 = np.nanpercentile(r, [50, 90])
            return f"p50 {p50:.1%}, p90 {p90:.1%}, max {np.nanmax(r):.1%}"

        return (
            f"{len(self.points)} points: agreement {self.agreement:.1%} ({sum(p.agree for p in self.points)} agree; "
            f"{self.same_choice} same choice, others within {self.tolerance:.0%} by pooled medians); "
            f"regret of a run's choice against the other's, by the other's medians: {spread(self.regrets())} "
            f"(raw, against the other's fastest median: {spread(self.regrets(raw=True))})"
        )


def _choices(frame: pd.DataFrame, baseline: str, margin: float) -> dict[tuple, str]:
    choices = {}
    for (op, dtype, view), group in frame.groupby(["op", "dtype", "view"], sort=False):
        for nbytes, backend in measured_winners(group, baseline, margin):
            choices[(op, dtype, view, nbytes)] = backend
    return choices


def _medians(frame: pd.DataFrame) -> dict[tuple, float]:
    return {tuple(r[k] for k in KEYS + ["backend"]): float(r["median_us"]) for _, r in frame.iterrows()}


def _pooled_medians(a: Run, b: Run) -> dict[tuple, float]:
    samples: dict[tuple, list[float]] = {}
    for record in a.records + b.records:
        if record.status == "ok":
            samples.setdefault((record.op, record.dtype, record.view, record.nbytes, record.backend), []).extend(record.samples_us)
    return {key: float(np.median(values)) for key, values in samples.items()}


def regret(here: dict[str, float], choice: str, theirs: str) -> tuple[float, float]:
    """(regret, raw regret) of `choice` by one point's medians by backend, where the other side chose `theirs`:
    its median over theirs, minus one (at least 0); and over the fastest, minus one. NaN for a choice with no median."""
    if choice not in here:
        return float("nan"), float("nan")
    raw = here[choice] / min(here.values()) - 1
    return (max(0.0, here[choice] / here[theirs] - 1) if theirs in here else raw), raw


def _medians_at(rows: dict[tuple, float], point: tuple) -> dict[str, float]:
    return {key[-1]: t for key, t in rows.items() if key[:-1] == point}


def compare_runs(a: Run, b: Run, baseline: str | None = None, margin: float = 0.05, tolerance: float = DEFAULT_TOLERANCE) -> Comparison:
    for name, value in (("--margin", margin), ("--tolerance", tolerance)):
        if not (math.isfinite(value) and 0 <= value <= MAX_FRACTION):
            raise ArxtuneError(f"{name} must be a number from 0 to {MAX_FRACTION:g} (a fraction such as 0.05), not {value}")
    if a.path.resolve() == b.path.resolve() or a.meta.run_id == b.meta.run_id:
        raise ArxtuneError(f"both runs are run {a.meta.run_id}; a run agrees with itself: compare two runs of the same grid")
    if baseline is not None:
        measured = {r.backend for r in a.records} & {r.backend for r in b.records}
        if baseline not in measured:
            raise ArxtuneError(
                f"--baseline {baseline!r} was not measured in both runs (both have: {', '.join(sorted(measured)) or 'none'})"
            )
    if baseline is None:
        if a.meta.baseline != b.meta.baseline:
            raise ArxtuneError(f"the runs have different baselines ({a.meta.baseline}, {b.meta.baseline}); pass --baseline")
        baseline = a.meta.baseline
    frame_a, frame_b = ((f[f.status == "ok"]) for f in (a.frame(), b.frame()))
    choices_a, choices_b = _choices(frame_a, baseline, margin), _choices(frame_b, baseline, margin)
    common = sorted(choices_a.keys() & choices_b.keys())
    if not common:
        raise ArxtuneError(f"runs {a.meta.run_id} and {b.meta.run_id} share no correct points; compare runs of the same grid")
    medians_a, medians_b, pooled = _medians(frame_a), _medians(frame_b), _pooled_medians(a, b)
    points = []
    for point in common:
        ca, cb = choices_a[point], choices_b[point]
        ratio = pooled.get(point + (ca,), float("nan")) / pooled.get(point + (cb,), float("nan"))
        agree = ca == cb or max(ratio, 1 / ratio) <= 1 + tolerance
        (regret_a, raw_a) = regret(_medians_at(medians_b, point), ca, cb)
        (regret_b, raw_b) = regret(_medians_at(medians_a, point), cb, ca)
        points.append(PointComparison(*point, ca, cb, ratio, regret_a, regret_b, bool(agree), raw_a, raw_b))  # type: ignore[call-arg]
    return Comparison(tuple(points), tolerance)
