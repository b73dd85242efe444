"""Runs -> one thresholds file, as a pure function.

Several runs (world sizes, runtime modes) merge into one file; conflicts are
an error unless the caller names the run that wins (see `calibrate`).

Per (op, dtype) and measured size the choice is winners.measured_winners':
the baseline keeps the point unless another correct backend beats it with
confidence, by more than `margin`, over a run of consecutive sizes. Sizes outside the measured grid get the choice predicted by the alpha-beta
fits of the baseline and of the backend that won the nearest measured size,
under the same margin rule.

Each range says whether its backend gave the baseline's bits at every
measured size it covers (a model range: at every size the backend was
measured; the baseline's ranges always do). With `invariant`, only such
backends compete at all, and a range not known to give the baseline's bits
goes to the baseline: the file routes without changing a single result bit.
"""

from __future__ import annotations

import math
import platform
from datetime import datetime, timezone
from typing import Sequence

import numpy as np
import pandas as pd

from arxtune import __version__
from arxtune.harness.winners import measured_winners
from arxtune.runtime.errors import ArxtuneError
from arxtune.harness.results import Run
from arxtune.runtime.fingerprint import Fingerprint
from arxtune.runtime.thresholds import (
    MAX_MARGIN,
    MODES,
    BackendSetup,
    Model,
    Range,
    SourceRun,
    Table,
    Thresholds,
    merge_adjacent,
    ranges_from_points,
)

DEFAULT_MARGIN = 0.05
#: How far beyond the measured grid the models extend the table, in grid steps.
EXTRAPOLATE_STEPS = 8
#: Runtime mode -> the run's timing views it is calibrated from, the first a run has wins. A run that
#: measured the decode view (each call behind a GPU kernel, no host sync: eager decode's pattern) feeds the
#: eager table from it.
DEFAULT_VIEWS: dict[str, tuple[str, ...]] = {"eager": ("decode", "eager", "isolated"), "graph": ("graph",)}


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


def cap_ranges(ranges: tuple[Range, ...], backend: str, limit: int, baseline: str) -> tuple[Range, ...]:
    """No range hands `backend` more than `limit` bytes (inclusive): beyond it the baseline takes over."""
    out: list[Range] = []
    for r in ranges:
        if r.backend != backend or (r.hi is not None and r.hi <= limit + 1):
            out.append(r)
        elif r.lo > limit:
            out.append(Range(r.lo, r.hi, baseline, r.source, True))
        else:
            out += [Range(r.lo, limit + 1, r.backend, r.source, r.bitwise), Range(limit + 1, r.hi, baseline, r.source, True)]
    return merge_adjacent(out)


def _flag(value) -> bool | None:
    """A frame's bitwise cell as True, False or None (not checked; pandas may hold it as NaN)."""
    return bool(value) if isinstance(value, (bool, np.bool_)) else None


def bitwise_flags(group: pd.DataFrame, baseline: str):
    """(backend, nbytes or None) -> whether the backend gave the baseline's bits at that measured size, or (None) at
    every size it was measured (what a model range beyond the grid claims); None where any of those was not checked."""
    flags = {(row.backend, int(row.nbytes)): _flag(row.bitwise) for row in group.itertuples()}

    def bits(backend: str, nbytes: int | None = None) -> bool | None:
        if backend == baseline:
            return True
        if nbytes is not None:
            return flags.get((backend, nbytes))
        values = [v for (b, _), v in flags.items() if b == backend]
        return None if not values or None in values else all(values)

    return bits


def invariant_ranges(ranges: tuple[Range, ...], baseline: str) -> tuple[Range, ...]:
    """Every range not known to give the baseline's bits goes to the baseline."""
    return merge_adjacent([r if r.bitwise else Range(r.lo, r.hi, baseline, r.source, True) for r in ranges])


def _op_tables(run: Run, ok: pd.DataFrame, mode: str, view: str, baseline: str, margin: float) -> tuple[list[Table], list[Model]]:
    """One run's tables (and models) for one runtime mode, from the correct points of one timing view."""
    tables, models = [], []
    world = run.meta.world_size
    step = float(run.meta.config.get("step_factor", 2.0))
    for (op, dtype), group in ok.groupby(["op", "dtype"], sort=False):
        group_models = []
        for backend, rows in group.groupby("backend", sort=False):
            fit = fit_alpha_beta(rows.nbytes.to_numpy(float), rows.median_us.to_numpy(float))
            if fit:
                group_models.append(Model(backend, op, dtype, world, *fit, mode=mode))
        models.extend(group_models)
        bits = bitwise_flags(group, baseline)
        points = [(float(size), w, "measured", bits(w, size)) for size, w in measured_winners(group, baseline, margin)]
        if not points:
            continue
        # Beyond the grid only the baseline and the backend that won the edge point confidently compete.
        below = [m for m in group_models if m.backend in {baseline, points[0][1]}]
        above = [m for m in group_models if m.backend in {baseline, points[-1][1]}]
        outside = [(points[0][0] / step**k, below) for k in range(EXTRAPOLATE_STEPS, 0, -1) if points[0][0] / step**k >= 1]
        outside += [(points[-1][0] * step**k, above) for k in range(1, EXTRAPOLATE_STEPS + 1)]
        for size, usable in outside:
            if w := _predicted_winner(usable, size, baseline, margin):
                points.append((size, w, "model", bits(w)))
        points.sort()
        tables.append(Table(op, dtype, world, ranges_from_points(points), mode, run.meta.run_id, view))
    return tables, models


def fingerprint_of(run: Run) -> Fingerprint:
    m = run.meta
    return Fingerprint(
        m.world_size,
        m.device_type,
        tuple(m.hostnames),
        tuple(m.device_names),
        m.driver_version,
        m.torch_version or None,
        m.nccl_version,
        tuple(m.rdma_devices) if m.rdma_devices else None,
    )


def _cluster(fp: Fingerprint) -> tuple:
    """What makes two runs come from the same cluster: the kind and names of devices and the driver."""
    return (fp.device_type, tuple(sorted(set(fp.device_names))), fp.driver_version)


def _setups(run: Run) -> dict[str, BackendSetup]:
    """The options and capacity each backend of the run was measured with (runs before format 2 of thresholds: none)."""
    return {
        name: BackendSetup(dict(s.get("options", {})), dict(s.get("capacity", {})))
        for name, s in run.meta.backends.items()
        if s.get("available") and (s.get("options") or s.get("capacity"))
    }


def _pick_run(prefer: str | None, runs: list[Run]) -> Run | None:
    if prefer is None:
        return None
    found = [r for r in runs if prefer in (r.meta.run_id, str(r.path), r.path.name)]
    if not found:
        raise ArxtuneError(f"--prefer {prefer} is none of the runs given ({', '.join(r.meta.run_id for r in runs)})")
    return found[0]


def _choose(what: str, a: Run, b: Run, preferred: Run | None) -> Run:
    """Which of two conflicting runs wins: the preferred one, else a one-line error."""
    if preferred in (a, b):
        return preferred
    raise ArxtuneError(f"runs {a.meta.run_id} and {b.meta.run_id} {what}; pass --prefer RUN to say which wins")


def calibrate(
    runs: Run | Sequence[Run],
    baseline: str | None = None,
    margin: float = DEFAULT_MARGIN,
    views: dict[str, str | tuple[str, ...]] | None = None,
    prefer: str | None = None,
    invariant: bool = False,
) -> Thresholds:
    """Several runs (world sizes, modes) -> one thresholds file.

    `views` maps each runtime mode to the run's timing view(s) it is calibrated
    from, first present wins (default DEFAULT_VIEWS). The same (mode, op,
    dtype, world size) from two runs, runs from different clusters, or
    different options for one backend are an error unless `prefer` names the
    run that wins. Every range is capped at its backend's capacity. With
    `invariant`, only the baseline and backends that gave its bits compete.
    """
    runs = [runs] if isinstance(runs, Run) else list(runs)
    if not runs:
        raise ArxtuneError("no runs to calibrate from")
    unchecked = next((r for r in runs if r.meta.version < 5), None)
    if invariant and unchecked is not None:
        raise ArxtuneError(
            f"run {unchecked.meta.run_id} (results format {unchecked.meta.version}) has no bitwise check, so --invariant "
            "cannot tell which backends give the baseline's bits; sweep again with this arxtune"
        )
    if not (math.isfinite(margin) and 0 <= margin <= MAX_MARGIN):
        raise ArxtuneError(f"--margin must be a number from 0 to {MAX_MARGIN:g} (a fraction such as 0.05), not {margin}")
    if len({r.meta.run_id for r in runs}) < len(runs):
        raise ArxtuneError("the same run is given twice")
    preferred = _pick_run(prefer, runs)
    baseline = _checked_baseline(runs, baseline, invariant)
    mode_views = _checked_views(views)
    fingerprints = {r.meta.run_id: fingerprint_of(r) for r in runs}
    for r in runs[1:]:
        if _cluster(fingerprints[r.meta.run_id]) != _cluster(fingerprints[runs[0].meta.run_id]):
            _choose("were measured on different clusters (devices or driver differ)", runs[0], r, preferred)
    setup: dict[str, tuple[Run, BackendSetup]] = {}
    chosen: dict[tuple, tuple[Run, Table]] = {}
    models: list[tuple[str, Model]] = []
    used_views: dict[str, dict[str, str]] = {}
    for r in runs:
        _add_setups(setup, r, preferred)
        frame = r.frame()
        if r.meta.baseline != baseline:
            frame = frame.assign(bitwise=None)
        ok = frame[frame.status == "ok"]
        if invariant:
            ok = ok[(ok.backend == baseline) | ok.bitwise.map(lambda v: _flag(v) is True)]
        for mode, candidates in mode_views.items():
            view = next((v for v in candidates if (ok["view"] == v).any()), None)
            if view is None:
                continue
            used_views.setdefault(r.meta.run_id, {})[mode] = view
            tables, run_models = _op_tables(r, ok[ok["view"] == view], mode, view, baseline, margin)
            models += [(r.meta.run_id, m) for m in run_models]
            for t in tables:
                if (
                    t.key in chosen
                    and _choose(f"both measure {t.op}/{t.dtype} at world size {t.world_size} for {t.mode}", chosen[t.key][0], r, preferred)
                    is not r
                ):
                    continue
                chosen[t.key] = (r, t)
    if not chosen:
        raise ArxtuneError(
            f"no correct points in the views {mode_views} of {', '.join(r.meta.run_id for r in runs)}; check `arxtune show RUN`"
        )
    final = _capped_tables(chosen, setup, baseline, invariant)
    kept = {t.run_id for t in final}
    # A model stays where its run's table was kept.
    models = [m for run_id, m in models if (t := chosen.get((m.mode, m.op, m.dtype, m.world_size))) and t[1].run_id == run_id]  # type: ignore[assignment, index, misc]
    provenance = {
        "runs": [r.meta.run_id for r in runs if r.meta.run_id in kept],
        "views": used_views,
        "prefer": preferred.meta.run_id if preferred else None,
        "world_sizes": sorted({t.world_size for t in final}),
        "modes": sorted({t.mode for t in final}),
        "invariant": invariant,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "calibrated_on": platform.node(),
        "arxtune_version": __version__,
    }
    sources = tuple(SourceRun(r.meta.run_id, fingerprints[r.meta.run_id]) for r in runs if r.meta.run_id in kept)
    return Thresholds(
        baseline,
        margin,
        provenance,
        tuple(sorted(final, key=lambda t: t.key)),
        tuple(models),  # type: ignore[arg-type]
        sources,
        {name: s for name, (_, s) in setup.items()},
    )


def _checked_baseline(runs: list[Run], baseline: str | None, invariant: bool) -> str:
    """The baseline every table is judged against: the runs' own, or `baseline` if they measured it."""
    if baseline is None:
        baselines = {r.meta.baseline for r in runs}
        if len(baselines) > 1:
            raise ArxtuneError(f"the runs have different baselines ({', '.join(sorted(baselines))}); pick one with --baseline")
        baseline = runs[0].meta.baseline
    else:
        measured = sorted({rec.backend for r in runs for rec in r.records})
        if baseline not in measured:
            raise ArxtuneError(
                f"baseline {baseline!r} was not measured in {', '.join(r.meta.run_id for r in runs)}; "
                f"pick one of {', '.join(measured) or 'none'}"
            )
    # A run checked bits against its own baseline: against another one its bitwise flags say nothing.
    other_baseline = next((r for r in runs if r.meta.baseline != baseline), None)
    if invariant and other_baseline is not None:
        raise ArxtuneError(
            f"run {other_baseline.meta.run_id} checked bits against its baseline {other_baseline.meta.baseline}, not "
            f"{baseline}; with --invariant keep --baseline {other_baseline.meta.baseline} (or sweep with --baseline {baseline})"
        )
    return baseline


def _checked_views(views: dict[str, str | tuple[str, ...]] | None) -> dict[str, tuple[str, ...]]:
    """Each runtime mode's timing views, first present wins; a mode or view that cannot feed it is an error."""
    checked = {mode: (v,) if isinstance(v, str) else tuple(v) for mode, v in (views or DEFAULT_VIEWS).items()}
    for mode, candidates in checked.items():
        if mode not in MODES:
            raise ArxtuneError(f"unknown runtime mode {mode!r}; the runtime tells {' and '.join(MODES)} apart")
        wrong = [v for v in candidates if v not in DEFAULT_VIEWS[mode]]
        if wrong:
            raise ArxtuneError(f"the {mode} table can be fed by the {' or '.join(DEFAULT_VIEWS[mode])} timing view, not {wrong[0]!r}")
    return checked


def _add_setups(setup: dict[str, tuple[Run, BackendSetup]], r: Run, preferred: Run | None) -> None:
    """Each backend's options as `r` opened it; two runs that opened one backend differently need `prefer`."""
    for name, s in _setups(r).items():
        if name in setup and setup[name][1] != s:
            winner = _choose(
                f"opened {name} with different options ({setup[name][1].options} vs {s.options})", setup[name][0], r, preferred
            )
            s = setup[name][1] if winner is setup[name][0] else s
            r_setup = winner
        else:
            r_setup = setup.get(name, (r, s))[0]
        setup[name] = (r_setup, s)


def _capped_tables(
    chosen: dict[tuple, tuple[Run, Table]], setup: dict[str, tuple[Run, BackendSetup]], baseline: str, invariant: bool
) -> list[Table]:
    """The chosen tables with every range capped at its backend's capacity (and only bit-equal ones, with `invariant`)."""
    final = []
    for _, t in chosen.values():
        ranges = t.ranges
        for name, (_, s) in setup.items():
            if t.op in s.capacity:
                ranges = cap_ranges(ranges, name, int(s.capacity[t.op]), baseline)
        final.append(
            Table(t.op, t.dtype, t.world_size, invariant_ranges(ranges, baseline) if invariant else ranges, t.mode, t.run_id, t.view)
        )
    return final


def baseline_warnings(runs: Run | Sequence[Run], baseline: str | None = None) -> list[str]:
    """Where an NCCL baseline (nccl, torch_nccl, a variant, vllm_pynccl) ran over sockets or one twin: every
    backend compared with it then looks better than it is."""
    from arxtune.harness.nccl_facts import problems

    warnings = []
    for r in [runs] if isinstance(runs, Run) else list(runs):
        name = (baseline or r.meta.baseline).split("[")[0]
        if not name.endswith("nccl"):
            continue
        for record in r.meta.nccl_used or []:
            for problem in problems(record):
                warnings.append(
                    f"run {r.meta.run_id}, rank {record.get('rank', '?')}: {problem}; the {name} baseline is slower "
                    f"than this fabric allows, so every comparison against it is unfair (see `arxtune doctor`)"
                )
    return list(dict.fromkeys(warnings))


def describe_views(thresholds: Thresholds) -> str:
    """Which timing view fed each runtime mode's tables, e.g. 'eager table from the eager timing view'."""
    pairs = sorted({(mode, view) for per_run in thresholds.provenance.get("views", {}).values() for mode, view in per_run.items()})
    return ", ".join(f"{mode} table from the {view} timing view" for mode, view in pairs) or "no tables"
