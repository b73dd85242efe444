"""The thresholds file: which backend to use for each (mode, op, dtype, world size, bytes).

Versioned JSON with provenance, validated on load. Ranges cover 0..infinity
without gaps; a range includes its lower bound and excludes its upper bound
(`hi` null = no upper bound). Sizes follow arxtune.runtime.ops's convention.
`mode` is the runtime's mode: `graph` while a CUDA graph is being captured,
`eager` otherwise; each table names the run and the timing view it came from.

Format history:
- version 1: tables of ranges plus alpha-beta models per backend; one run, one mode.
- version 2: tables and models keyed by mode as well; several runs (world sizes)
  in one file, each with the fingerprint of what it was measured on; per-backend
  options and capacity (what the runtime opens the backend with). Version 1
  files are still read (their tables get the mode their provenance names).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from arxtune.runtime.backends import OPS
from arxtune.runtime.ops import DTYPES
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime.fileio import read_text, write_text_atomic

THRESHOLDS_VERSION = 2
READABLE_VERSIONS = (1, 2)
KIND = "arxtune-thresholds"
SOURCES = ("measured", "model", "override")
MODES = ("eager", "graph")


@dataclass(frozen=True)
class Range:
    lo: int
    hi: int | None
    backend: str
    source: str = "measured"  # measured on the grid, predicted by the alpha-beta models, or an override


@dataclass(frozen=True)
class Table:
    op: str
    dtype: str
    world_size: int
    ranges: tuple[Range, ...]
    mode: str = "eager"  # the runtime mode this table serves
    run_id: str = ""  # the run it was calibrated from
    view: str = ""  # that run's timing view it was calibrated from (e.g. eager, isolated, graph)

    @property
    def key(self) -> tuple[str, str, str, int]:
        return (self.mode, self.op, self.dtype, self.world_size)


@dataclass(frozen=True)
class Model:
    """Latency + bytes / bandwidth fit of one backend's medians."""

    backend: str
    op: str
    dtype: str
    world_size: int
    alpha_us: float
    bandwidth_gbps: float | None  # None: no measurable growth with size over the grid
    mode: str = "eager"

    def predict_us(self, nbytes: float) -> float:
        return self.alpha_us + (nbytes / (self.bandwidth_gbps * 1e3) if self.bandwidth_gbps else 0.0)


@dataclass(frozen=True)
class Fingerprint:
    """What a run was measured on; compared with the running group at start-up."""

    world_size: int
    device_type: str = ""
    hostnames: tuple[str, ...] = ()
    device_names: tuple[str, ...] = ()
    driver_version: str | None = None
    torch_version: str | None = None
    nccl_version: str | None = None
    rdma_devices: tuple[str, ...] | None = None

    def differences(self, running: "Fingerprint") -> list[str]:
        """'what: recorded vs running' for every field known on both sides that differs (hosts as sets)."""
        found = []
        for f in fields(self):
            recorded, now = getattr(self, f.name), getattr(running, f.name)
            if recorded in (None, "", ()) or now in (None, ""):
                continue
            if isinstance(recorded, tuple):
                recorded, now = sorted(set(recorded)), sorted(set(now))
            if recorded != now:
                found.append(f"{f.name} {_show(recorded)} vs {_show(now)}")
        return found


def _show(value) -> str:
    return (",".join(value) or "none") if isinstance(value, list) else str(value)


@dataclass(frozen=True)
class SourceRun:
    run_id: str
    fingerprint: Fingerprint


@dataclass(frozen=True)
class BackendSetup:
    """How a backend was opened when it was measured; the runtime opens it the same way."""

    options: dict = field(default_factory=dict)  # e.g. arx: {"max_bytes": 8388608, "devices": [...]}
    capacity: dict = field(default_factory=dict)  # op -> largest bytes it takes; an op not named has no limit


@dataclass(frozen=True)
class Thresholds:
    baseline: str
    margin: float
    provenance: dict
    tables: tuple[Table, ...]
    models: tuple[Model, ...] = ()
    runs: tuple[SourceRun, ...] = ()
    backend_setup: dict[str, BackendSetup] = field(default_factory=dict)
    version: int = THRESHOLDS_VERSION
    kind: str = KIND

    @property
    def world_sizes(self) -> set[int]:
        return {t.world_size for t in self.tables}

    @property
    def backends(self) -> set[str]:
        return {r.backend for t in self.tables for r in t.ranges}

    def table(self, op: str, dtype: str, world_size: int, mode: str = "eager") -> Table | None:
        return next((t for t in self.tables if t.key == (mode, op, dtype, world_size)), None)

    def run(self, run_id: str) -> SourceRun | None:
        return next((r for r in self.runs if r.run_id == run_id), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n", "thresholds file")

    def to_csv(self) -> str:
        """arxtune's ranges, one line each, in the spirit of NCCL's tuner files (first match wins, -1 a wildcard / no
        bound) but not their format: the NCCL tuner plugin reads arxtune.runtime.nccl_tuner.tuner_csv()'s file."""
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["collective", "min_bytes", "max_bytes", "backend", "dtype", "mode", "nNodes", "nRanks"])
        for t in self.tables:
            run = self.run(t.run_id)
            nodes = len(set(run.fingerprint.hostnames)) if run and run.fingerprint.hostnames else -1
            for r in t.ranges:
                writer.writerow([t.op, r.lo, -1 if r.hi is None else r.hi - 1, r.backend, t.dtype, t.mode, nodes, t.world_size])
        return buffer.getvalue()


def merge_adjacent(ranges: list[Range]) -> tuple[Range, ...]:
    """Sorted, gap-free ranges with neighbours of the same backend and source joined into one."""
    merged: list[Range] = []
    for r in ranges:
        if merged and (merged[-1].backend, merged[-1].source) == (r.backend, r.source):
            merged[-1] = Range(merged[-1].lo, r.hi, r.backend, r.source)
        else:
            merged.append(r)
    return tuple(merged)


def ranges_from_points(points: list[tuple[float, str, str]]) -> tuple[Range, ...]:
    """Sorted (bytes, backend, source) -> contiguous ranges with geometric-midpoint boundaries
    (calibrate and the start-up ladder place boundaries alike)."""
    ranges: list[Range] = []
    for i, (size, backend, source) in enumerate(points):
        lo = 0 if i == 0 else int(math.ceil(math.sqrt(points[i - 1][0] * size)))
        if ranges and ranges[-1].backend == backend and ranges[-1].source == source:
            continue
        if ranges:
            ranges[-1] = Range(ranges[-1].lo, lo, ranges[-1].backend, ranges[-1].source)
        ranges.append(Range(lo, None, backend, source))
    return tuple(ranges)


def _fail(source: str, what: str) -> FormatError:
    return FormatError(f"{source}: {what}; regenerate it with `arxtune calibrate RUN [RUN ...]`")


def validate_ranges(ranges: tuple[Range, ...], where: str, source: str) -> None:
    if not ranges:
        raise _fail(source, f"{where} has no ranges")
    if ranges[0].lo != 0 or ranges[-1].hi is not None:
        raise _fail(source, f"{where} must cover 0 bytes to no upper bound")
    for prev, cur in zip(ranges, ranges[1:]):
        if prev.hi is None or prev.hi != cur.lo or cur.lo <= prev.lo:
            raise _fail(source, f"{where} has a gap or overlap at {prev.hi}")
    for r in ranges:
        if not r.backend or r.source not in SOURCES:
            raise _fail(source, f"{where} has a range without a backend or with an unknown source")


def _upgrade_v1(data: dict) -> dict:
    """A version-1 file as version 2: its one run, its one mode, no backend options."""
    provenance = dict(data["provenance"])
    mode = provenance.get("mode", "eager")
    run_id = str(provenance.get("run_id", ""))
    tables = [{**t, "mode": mode, "run_id": run_id, "view": mode} for t in data["tables"]]
    models = [{**m, "mode": mode} for m in data.get("models", [])]
    worlds = {int(t["world_size"]) for t in data["tables"]}
    runs = [{"run_id": run_id, "fingerprint": {
        "world_size": provenance.get("world_size") or (worlds.pop() if len(worlds) == 1 else 0),
        "device_type": provenance.get("device_type", ""), "hostnames": provenance.get("hostnames", []),
        "device_names": provenance.get("device_names", [])}}]
    return {**data, "version": 2, "tables": tables, "models": models, "runs": runs, "backend_setup": {}}


def _tuple_or_none(value):
    return None if value is None else tuple(value)


def _fingerprint(data: dict) -> Fingerprint:
    data = dict(data)
    for key in ("hostnames", "device_names"):
        data[key] = tuple(data.get(key, ()))
    data["rdma_devices"] = _tuple_or_none(data.get("rdma_devices"))
    return Fingerprint(**data)


def from_dict(data: dict, source: str = "thresholds") -> Thresholds:
    """Validate and build; anything off is one FormatError saying where."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise _fail(source, "not an arxtune thresholds file")
    if data.get("version") not in READABLE_VERSIONS:
        raise _fail(source, f"version {data.get('version')!r} is not supported (this arxtune reads "
                            f"{', '.join(map(str, READABLE_VERSIONS))})")
    try:
        if data["version"] == 1:
            data = _upgrade_v1(data)
        tables = tuple(Table(t["op"], t["dtype"], int(t["world_size"]), tuple(Range(**r) for r in t["ranges"]),
                             str(t["mode"]), str(t.get("run_id", "")), str(t.get("view", ""))) for t in data["tables"])
        models = tuple(Model(**m) for m in data.get("models", []))
        runs = tuple(SourceRun(str(r["run_id"]), _fingerprint(r["fingerprint"])) for r in data["runs"])
        setup = {str(name): BackendSetup(dict(s.get("options", {})), {str(op): int(b) for op, b in s.get("capacity", {}).items()})
                 for name, s in data["backend_setup"].items()}
        result = Thresholds(str(data["baseline"]), float(data["margin"]), dict(data["provenance"]), tables, models, runs, setup)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _fail(source, f"malformed ({type(exc).__name__}: {exc})") from None
    seen = set()
    for t in tables:
        where = f"table {t.mode}/{t.op}/{t.dtype}/w{t.world_size}"
        if t.op not in OPS or t.dtype not in DTYPES or t.world_size < 1 or t.mode not in MODES:
            raise _fail(source, f"{where} names an unknown mode, op, dtype or world size")
        if t.key in seen:
            raise _fail(source, f"{where} appears twice")
        seen.add(t.key)
        validate_ranges(t.ranges, where, source)
    for name, setup in result.backend_setup.items():
        if any(op not in OPS or limit < 0 for op, limit in setup.capacity.items()):
            raise _fail(source, f"backend {name}'s capacity names an unknown op or a negative size")
    return result


def load(path: str | Path) -> Thresholds:
    path = Path(path)
    if not path.exists():
        raise FormatError(f"thresholds file {path} not found; create it with `arxtune calibrate RUN --out {path}`")
    try:
        data = json.loads(read_text(path, "thresholds file"))
    except ArxtuneError as exc:
        raise FormatError(str(exc)) from None
    except json.JSONDecodeError as exc:
        raise _fail(str(path), f"not valid JSON ({exc})") from None
    return from_dict(data, str(path))
