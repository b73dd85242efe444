"""The thresholds file: which backend to use for each (op, dtype, world size, bytes).

Versioned JSON with provenance, validated on load. Ranges cover 0..infinity
without gaps; a range includes its lower bound and excludes its upper bound
(`hi` null = no upper bound). Sizes follow collectives.py's convention.

Format history:
- version 1: tables of ranges plus alpha-beta models per backend.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from .backends import OPS
from .collectives import DTYPES
from .errors import ArxtuneError, FormatError
from .fileio import read_text, write_text_atomic

THRESHOLDS_VERSION = 1
KIND = "arxtune-thresholds"
SOURCES = ("measured", "model")


@dataclass(frozen=True)
class Range:
    lo: int
    hi: int | None
    backend: str
    source: str = "measured"  # measured on the grid, or predicted by the alpha-beta models


@dataclass(frozen=True)
class Table:
    op: str
    dtype: str
    world_size: int
    ranges: tuple[Range, ...]


@dataclass(frozen=True)
class Model:
    """Latency + bytes / bandwidth fit of one backend's medians."""

    backend: str
    op: str
    dtype: str
    world_size: int
    alpha_us: float
    bandwidth_gbps: float | None  # None: no measurable growth with size over the grid

    def predict_us(self, nbytes: float) -> float:
        return self.alpha_us + (nbytes / (self.bandwidth_gbps * 1e3) if self.bandwidth_gbps else 0.0)


@dataclass(frozen=True)
class Thresholds:
    baseline: str
    margin: float
    provenance: dict
    tables: tuple[Table, ...]
    models: tuple[Model, ...] = ()
    version: int = THRESHOLDS_VERSION
    kind: str = KIND

    @property
    def world_sizes(self) -> set[int]:
        return {t.world_size for t in self.tables}

    @property
    def backends(self) -> set[str]:
        return {r.backend for t in self.tables for r in t.ranges}

    def table(self, op: str, dtype: str, world_size: int) -> Table | None:
        return next((t for t in self.tables if (t.op, t.dtype, t.world_size) == (op, dtype, world_size)), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def save(self, path: str | Path) -> Path:
        return write_text_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n", "thresholds file")

    def to_csv(self) -> str:
        """NCCL-tuner-style lines: first match wins, -1 is a wildcard / no bound."""
        nodes = len(set(self.provenance.get("hostnames", []))) or -1
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        writer.writerow(["collective", "min_bytes", "max_bytes", "backend", "dtype", "nNodes", "nRanks"])
        for t in self.tables:
            for r in t.ranges:
                writer.writerow([t.op, r.lo, -1 if r.hi is None else r.hi - 1, r.backend, t.dtype, nodes, t.world_size])
        return buffer.getvalue()


def _fail(source: str, what: str) -> FormatError:
    return FormatError(f"{source}: {what}; regenerate it with `arxtune calibrate RUN`")


def _validate_ranges(ranges: tuple[Range, ...], where: str, source: str) -> None:
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


def from_dict(data: dict, source: str = "thresholds") -> Thresholds:
    """Validate and build; anything off is one FormatError saying where."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise _fail(source, "not an arxtune thresholds file")
    if data.get("version") != THRESHOLDS_VERSION:
        raise _fail(source, f"version {data.get('version')!r} is not supported (this arxtune reads {THRESHOLDS_VERSION})")
    try:
        tables = tuple(
            Table(t["op"], t["dtype"], int(t["world_size"]), tuple(Range(**r) for r in t["ranges"]))
            for t in data["tables"])
        models = tuple(Model(**m) for m in data.get("models", []))
        result = Thresholds(str(data["baseline"]), float(data["margin"]), dict(data["provenance"]), tables, models)
    except (KeyError, TypeError, ValueError) as exc:
        raise _fail(source, f"malformed ({type(exc).__name__}: {exc})") from None
    seen = set()
    for t in tables:
        where = f"table {t.op}/{t.dtype}/w{t.world_size}"
        if t.op not in OPS or t.dtype not in DTYPES or t.world_size < 1:
            raise _fail(source, f"{where} names an unknown op, dtype or world size")
        if (t.op, t.dtype, t.world_size) in seen:
            raise _fail(source, f"{where} appears twice")
        seen.add((t.op, t.dtype, t.world_size))
        _validate_ranges(t.ranges, where, source)
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


class Lookup:
    """(op, dtype, nbytes) -> choice for one world size: a dict get and a bisect per call.

    `resolve` maps a backend name to what `choose` returns (by default the name
    itself); the communicator resolves names to backend objects once, up front.
    """

    def __init__(self, thresholds: Thresholds, world_size: int, resolve: Callable[[str], Any] = str):
        self._tables: dict[tuple, tuple[list[int], list]] = {}
        for t in thresholds.tables:
            if t.world_size == world_size:
                self._tables[(t.op, DTYPES[t.dtype])] = ([r.lo for r in t.ranges[1:]], [resolve(r.backend) for r in t.ranges])

    def __bool__(self) -> bool:
        return bool(self._tables)

    def choose(self, op: str, dtype, nbytes: int):
        """The choice for this call, or None when no table covers (op, dtype)."""
        entry = self._tables.get((op, dtype))
        if entry is None:
            return None
        starts, choices = entry
        return choices[bisect.bisect_right(starts, nbytes)]
