"""Runs as DataFrames: the run format itself (records, meta, writer, reader, resume) is arxtune.runtime.runs,
re-exported here for the harness; this module adds the summaries and bandwidths a frame row carries."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

from arxtune.harness.stats import bandwidths, summarize
from arxtune.runtime import runs
from arxtune.runtime.ops import OP_SPECS
from arxtune.runtime.runs import (  # noqa: F401 (re-exported for the harness)
    FORMAT_VERSION,
    HEADERS,
    META_FILE,
    POINT_COLUMNS,
    POINTS_FILE,
    READABLE_VERSIONS,
    STATUSES,
    PointRecord,
    RunExists,
    RunMeta,
    RunWriter,
    _write_json_atomic,
    read_meta,
)

SUMMARY_COLUMNS = [
    "rounds",
    "round_medians_us",
    "median_us",
    "p10_us",
    "p90_us",
    "p99_us",
    "ci_low_us",
    "ci_high_us",
    "unstable",
    "algbw_gbps",
    "busbw_gbps",
]
FRAME_COLUMNS = [c for c in POINT_COLUMNS if c not in ("samples_us", "round_iters")] + SUMMARY_COLUMNS


@dataclass
class Run(runs.Run):
    def frame(self) -> pd.DataFrame:
        """One row per point with its summary statistics and bandwidths."""
        return points_frame(self.records)


def load_run(path: str | Path) -> Run:
    """Read a run directory; a missing, corrupt or unknown-version run is a FormatError."""
    return Run(**vars(runs.load_run(path)))


def resumable(path: str | Path) -> Run:
    """The run at `path` if it can be continued: readable and not finished."""
    return Run(**vars(runs.resumable(path)))


def points_frame(records: list[PointRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        row = {k: v for k, v in asdict(r).items() if k not in ("samples_us", "round_iters")}
        row["iters"] = len(r.samples_us)
        if r.status == "ok" and r.samples_us:
            s = summarize(r.samples_us, r.round_iters)
            algbw, busbw = bandwidths(r.nbytes, s.median_us * 1e-6, OP_SPECS[r.op].bus_factor(r.world_size))
            row.update(
                rounds=s.rounds,
                round_medians_us=s.round_medians_us,
                median_us=s.median_us,
                p10_us=s.p10_us,
                p90_us=s.p90_us,
                p99_us=s.p99_us,
                ci_low_us=s.ci_low_us,
                ci_high_us=s.ci_high_us,
                unstable=s.unstable,
                algbw_gbps=algbw,
                busbw_gbps=busbw,
            )
        rows.append(row)
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)
