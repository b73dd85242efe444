"""Run storage: one directory per run, a meta.json and an append-only points.csv.

points.csv gets one line per measured point, flushed as soon as the point is
done, so an interrupted sweep keeps every finished point and `--resume`
continues it. Raw per-iteration samples (max across ranks) are stored, not
only summaries; summaries are derived on load.

Format history:
- version 1: meta.json + points.csv with the columns in POINT_COLUMNS.
"""

from __future__ import annotations

import csv
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

from .collectives import OP_SPECS
from .errors import ArxtuneError, FormatError
from .stats import bandwidths, summarize

FORMAT_VERSION = 1
META_FILE = "meta.json"
POINTS_FILE = "points.csv"
POINT_COLUMNS = ["backend", "op", "dtype", "mode", "size", "nbytes", "world_size", "status", "iters", "samples_us", "error"]
STATUSES = ("ok", "wrong", "error", "unsupported")
SUMMARY_COLUMNS = ["median_us", "p10_us", "p90_us", "ci_low_us", "ci_high_us", "unstable", "algbw_gbps", "busbw_gbps"]
FRAME_COLUMNS = [c for c in POINT_COLUMNS if c != "samples_us"] + SUMMARY_COLUMNS


@dataclass(frozen=True)
class PointRecord:
    """One (backend, op, dtype, mode, size) measurement as stored."""

    backend: str
    op: str
    dtype: str
    mode: str
    size: int  # the grid size asked for
    nbytes: int  # the bytes actually moved (rounded to whole elements per rank)
    world_size: int
    status: str  # ok | wrong (failed the check) | error (raised) | unsupported
    samples_us: tuple[float, ...] = ()
    error: str = ""

    @property
    def key(self) -> tuple:
        return (self.backend, self.op, self.dtype, self.mode, self.size)

    def to_row(self) -> list:
        return [self.backend, self.op, self.dtype, self.mode, self.size, self.nbytes, self.world_size,
                self.status, len(self.samples_us), " ".join(f"{s:.3f}" for s in self.samples_us), self.error]


@dataclass
class RunMeta:
    """Everything needed to interpret and reproduce a run."""

    run_id: str
    world_size: int
    device_type: str
    config: dict
    baseline: str
    started: str
    version: int = FORMAT_VERSION
    finished: str | None = None
    arxtune_version: str = ""
    torch_version: str = ""
    nccl_version: str | None = None
    driver_version: str | None = None  # NVIDIA driver on rank 0's host
    rdma_devices: list[str] = field(default_factory=list)  # RDMA devices on rank 0's host
    hostnames: list[str] = field(default_factory=list)
    device_names: list[str] = field(default_factory=list)
    backends: dict = field(default_factory=dict)  # name -> {"available": bool, "reason": str, "capturable": bool}
    fabric_floor_us: float | None = None
    command: str = ""

    @classmethod
    def from_dict(cls, data: dict, source: Path) -> "RunMeta":
        version = data.get("version")
        if version != FORMAT_VERSION:
            raise FormatError(f"{source}: results format version {version!r} is not supported (this arxtune reads {FORMAT_VERSION}); re-run the sweep or upgrade arxtune")
        try:
            return cls(**data)
        except TypeError as exc:
            raise FormatError(f"{source}: meta.json does not match format {FORMAT_VERSION} ({exc}); the run is corrupt") from None


def _write_json_atomic(path: Path, data: dict) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class RunWriter:
    """Appends points to a run directory as they finish. Only rank 0 uses it."""

    def __init__(self, path: Path, meta: RunMeta, done: dict[tuple, PointRecord]):
        self.path = path
        self.meta = meta
        self.done = done
        self._file = open(path / POINTS_FILE, "a", newline="")
        self._csv = csv.writer(self._file)

    @classmethod
    def create(cls, out_dir: str | Path, meta: RunMeta) -> "RunWriter":
        path = Path(out_dir) / meta.run_id
        if path.exists():
            raise ArxtuneError(f"{path} already exists; pick another --out or resume it with --resume {path}")
        path.mkdir(parents=True)
        with open(path / POINTS_FILE, "w", newline="") as handle:
            csv.writer(handle).writerow(POINT_COLUMNS)
        _write_json_atomic(path / META_FILE, asdict(meta))
        return cls(path, meta, {})

    @classmethod
    def resume(cls, path: str | Path) -> "RunWriter":
        """Reopen an interrupted run; a torn last line is cut off so new points start on a line of their own."""
        run = load_run(path)
        run.meta.finished = None
        points = run.path / POINTS_FILE
        tmp = points.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(POINT_COLUMNS)
            writer.writerows(record.to_row() for record in run.records)
        os.replace(tmp, points)
        return cls(run.path, run.meta, {record.key: record for record in run.records})

    def append(self, record: PointRecord) -> None:
        self._csv.writerow(record.to_row())
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done[record.key] = record

    def write_meta(self) -> None:
        _write_json_atomic(self.path / META_FILE, asdict(self.meta))

    def close(self) -> None:
        self._file.close()


@dataclass
class Run:
    path: Path
    meta: RunMeta
    records: list[PointRecord]

    def frame(self) -> pd.DataFrame:
        """One row per point with its summary statistics and bandwidths."""
        return points_frame(self.records)


def _parse_samples(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split()) if text else ()


def _parse_row(row: list[str], where: str) -> PointRecord:
    try:
        backend, op, dtype, mode, size, nbytes, world, status, iters, samples, error = row
        record = PointRecord(backend, op, dtype, mode, int(size), int(nbytes), int(world), status, _parse_samples(samples), error)
        consistent = status in STATUSES and op in OP_SPECS and int(iters) == len(record.samples_us)
    except ValueError as exc:
        raise FormatError(f"{where}: {exc}; the run is corrupt") from None
    if not consistent:
        raise FormatError(f"{where}: inconsistent record; the run is corrupt")
    return record


def load_run(path: str | Path) -> Run:
    """Read a run directory; a missing, corrupt or unknown-version run is a FormatError."""
    path = Path(path)
    meta_path, points_path = path / META_FILE, path / POINTS_FILE
    if not meta_path.is_file() or not points_path.is_file():
        raise FormatError(f"{path} is not an arxtune run (needs {META_FILE} and {POINTS_FILE}); pass a directory under results/")
    try:
        meta = RunMeta.from_dict(json.loads(meta_path.read_text()), meta_path)
    except json.JSONDecodeError as exc:
        raise FormatError(f"{meta_path} is not valid JSON ({exc}); the run is corrupt") from None
    with open(points_path, newline="") as handle:
        rows = list(csv.reader(handle))
    if not rows or rows[0] != POINT_COLUMNS:
        raise FormatError(f"{points_path} has unexpected columns; the run is corrupt or from another version")
    body = rows[1:]
    if body and len(body[-1]) != len(POINT_COLUMNS):
        body.pop()  # a torn last line from an interrupted write: that point is simply re-run on resume
    records = [_parse_row(row, f"{points_path}:{line_no}") for line_no, row in enumerate(body, start=2)]
    return Run(path, meta, records)


def points_frame(records: list[PointRecord]) -> pd.DataFrame:
    rows = []
    for r in records:
        row = {k: v for k, v in asdict(r).items() if k != "samples_us"}
        row["iters"] = len(r.samples_us)
        if r.status == "ok" and r.samples_us:
            s = summarize(r.samples_us)
            algbw, busbw = bandwidths(r.nbytes, s.median_us * 1e-6, OP_SPECS[r.op].bus_factor(r.world_size))
            row.update(median_us=s.median_us, p10_us=s.p10_us, p90_us=s.p90_us, ci_low_us=s.ci_low_us,
                       ci_high_us=s.ci_high_us, unstable=s.unstable, algbw_gbps=algbw, busbw_gbps=busbw)
        rows.append(row)
    return pd.DataFrame(rows, columns=FRAME_COLUMNS)
