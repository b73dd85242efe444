"""Run -> thresholds, as a pure function.

Per (op, dtype) and measured size the choice is decision.measured_winners':
the baseline keeps the point unless another correct backend beats it with
confidence, by more than `margin`, over a run of consecutive sizes. Sizes outside the measured grid get the choice predicted by the alpha-beta
fits of the baseline and of the backend that won the nearest measured size,
under the same margin rule.
"""

from __future__ import annotations

import math
import platform
from datetime import datetime, timezone

import numpy as np
import pandas as pd

from . import __version__
from .errors import ArxtuneError
from .decision import measured_winners
from .results import Run
from .thresholds import Model, Range, Table, Thresholds

DEFAULT_MARGIN = 0.05
#: How far beyond the measured grid the models extend the table, in grid steps.
EXTRAPOLATE_STEPS = 8


def fit_alpha_beta(nbytes: np.ndarray, median_us: np.ndarray) -> tuple[float, float | None] | None:
    """Least squares of t = alpha + bytes/bandwidth in relative error: (alpha_us, GB/s), or None with < 2 points.

    When the times show no growth with size, the fit is latency only (bandwidth None).
    """
    usable = np.isfinite(nbytes) & np.isfinite(median_us) & (nbytes > 0) & (median_us > 0)
    nbytes, median_us = nbytes[usable], median_us[usable]
    if len(np.unique(nbytes)) < 2:
        return None
    weights = 1.0 / median_us
    design = np.stack([weights, nbytes * weights], axis=1)
    (alpha, slope), *_ = np.linalg.lstsq(design, np.ones_like(median_us), rcond=None)
    if slope <= 0:
        return float(np.median(median_us)), None
    return max(0.0, float(alpha)), float(1e-3 / slope)


def _predicted_winner(models: list[Model], nbytes: float, baseline: str, margin: float) -> str | None:
    if not models:
        return None
    times = {m.backend: m.predict_us(nbytes) for m in models}
    best = min(times, key=times.get)
    if baseline in times and best != baseline and times[best] * (1 + margin) >= times[baseline]:
        return baseline
    return best


def _ranges(points: list[tuple[float, str, str]]) -> tuple[Range, ...]:
    """Sorted (bytes, backend, source) -> contiguous ranges with geometric-midpoint boundaries."""
    ranges: list[Range] = []
    for i, (size, backend, source) in enumerate(points):
        lo = 0 if i == 0 else int(math.ceil(math.sqrt(points[i - 1][0] * size)))
        if ranges and ranges[-1].backend == backend and ranges[-1].source == source:
            continue
        if ranges:
            ranges[-1] = Range(ranges[-1].lo, lo, ranges[-1].backend, ranges[-1].source)
        ranges.append(Range(lo, None, backend, source))
    return tuple(ranges)


#: Timing views (run modes) that may feed each table the runtime knows; the first is the default.
VIEWS = {"eager": ("eager", "isolated"), "graph": ("graph",)}


def calibrate(run: Run, baseline: str | None = None, margin: float = DEFAULT_MARGIN, mode: str = "eager",
              view: str | None = None) -> Thresholds:
    """`view` is the run's timing mode that feeds the `mode` table (eager: back-to-back calls, or isolated)."""
    asked, baseline = baseline, baseline or run.meta.baseline
    if not (math.isfinite(margin) and margin >= 0):
        raise ArxtuneError(f"--margin must be a number not below 0 (a fraction such as 0.05), not {margin}")
    measured = sorted({r.backend for r in run.records})
    if asked and asked not in measured:
        raise ArxtuneError(f"baseline {baseline!r} was not measured in run {run.meta.run_id}; pick one of {', '.join(measured) or 'none'}")
    if mode not in VIEWS:
        raise ArxtuneError(f"unknown mode {mode!r}; use one of {', '.join(VIEWS)}")
    view = view or VIEWS[mode][0]
    if view not in VIEWS[mode]:
        raise ArxtuneError(f"the {mode} table can be fed by the {' or '.join(VIEWS[mode])} timing view, not {view!r}")
    frame = run.frame()
    ok = frame[(frame.status == "ok") & (frame["mode"] == view)]
    if ok.empty:
        raise ArxtuneError(f"run {run.meta.run_id} has no correct {view} points to calibrate from; check `arxtune show {run.path}`")
    tables, models = [], []
    step = float(run.meta.config.get("step_factor", 2.0))
    for (op, dtype), group in ok.groupby(["op", "dtype"], sort=False):
        group_models = []
        for backend, rows in group.groupby("backend", sort=False):
            fit = fit_alpha_beta(rows.nbytes.to_numpy(float), rows.median_us.to_numpy(float))
            if fit:
                group_models.append(Model(backend, op, dtype, run.meta.world_size, *fit))
        models.extend(group_models)
        points = [(float(size), w, "measured") for size, w in measured_winners(group, baseline, margin)]
        if not points:
            continue
        # Beyond the grid only the baseline and the backend that won the edge point confidently compete.
        below = [m for m in group_models if m.backend in {baseline, points[0][1]}]
        above = [m for m in group_models if m.backend in {baseline, points[-1][1]}]
        outside = [(points[0][0] / step**k, below) for k in range(EXTRAPOLATE_STEPS, 0, -1) if points[0][0] / step**k >= 1]
        outside += [(points[-1][0] * step**k, above) for k in range(1, EXTRAPOLATE_STEPS + 1)]
        for size, usable in outside:
            if (w := _predicted_winner(usable, size, baseline, margin)):
                points.append((size, w, "model"))
        points.sort()
        tables.append(Table(op, dtype, run.meta.world_size, _ranges(points)))
    provenance = {
        "run_id": run.meta.run_id, "hostnames": run.meta.hostnames, "device_names": run.meta.device_names,
        "world_size": run.meta.world_size, "device_type": run.meta.device_type, "mode": mode, "view": view,
        "backends": sorted(ok.backend.unique()), "fabric_floor_us": run.meta.fabric_floor_us,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"), "calibrated_on": platform.node(),
        "arxtune_version": __version__,
    }
    return Thresholds(baseline, margin, provenance, tuple(tables), tuple(models))
