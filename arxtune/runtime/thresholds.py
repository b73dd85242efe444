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
- version 3: each range says whether its backend gave the baseline's bits
  there (`bitwise`: true, false, or null when not known), so a deployment
  that needs results independent of the backend choice can tell. Version 1
  and 2 files are still read (every range: not known).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from arxtune.runtime.fingerprint import Fingerprint
from arxtune.runtime.ops import DTYPES, OPS
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime import schema
from arxtune.runtime.fileio import check_exists, read_text, write_text_atomic

THRESHOLDS_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
KIND = "arxtune-thresholds"
SOURCES = ("measured", "model", "override")
MODES = ("eager", "graph")


@dataclass(frozen=True)
class Range:
    lo: int
    hi: int | None
    backend: str
    source: str = "measured"  # measured on the grid, predicted by the alpha-beta models, or an override
    #: Whether the backend's results had the baseline's bits on random data here (harness/bitwise.py); None: not known.
    bitwise: bool | None = None


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

    def named_backends(self) -> list[tuple[str, str]]:
        """(field, backend name) for every name the file holds, in file order."""
        found = [("baseline", self.baseline)]
        found += [(f"tables.{i}.ranges.{j}.backend", r.backend) for i, t in enumerate(self.tables) for j, r in enumerate(t.ranges)]
        found += [(f"models.{i}.backend", m.backend) for i, m in enumerate(self.models)]
        return found + [("backend_setup", name) for name in self.backend_setup]

    def not_bitwise(self, world_size: int, native) -> list[str]:
        """The ranges at `world_size` that go to a backend other than the `native(name)` ones without being known
        to give the baseline's bits, as 'mode op/dtype [lo, hi) -> backend'."""
        from arxtune.runtime.units import format_bytes

        return [
            f"{t.mode} {t.op}/{t.dtype} [{format_bytes(r.lo)}, {'inf' if r.hi is None else format_bytes(r.hi)}) -> {r.backend}"
            for t in self.tables
            if t.world_size == world_size
            for r in t.ranges
            if r.bitwise is not True and r.backend != self.baseline and not native(r.backend)
        ]

    def table(self, op: str, dtype: str, world_size: int, mode: str = "eager") -> Table | None:
        return next((t for t in self.tables if t.key == (mode, op, dtype, world_size)), None)

    def run(self, run_id: str) -> SourceRun | None:
        return next((r for r in self.runs if r.run_id == run_id), None)

    def to_dict(self) -> dict:
        return asdict(self)

    def to_text(self, where: str = "thresholds") -> str:
        """The file's text, after checking that it reads back (a file the loader would refuse is never written)."""
        data = self.to_dict()
        from_dict(json.loads(json.dumps(data)), where)
        return json.dumps(data, indent=2) + "\n"

    def save(self, path: str | Path) -> Path:
        return write_text_atomic(path, self.to_text(f"thresholds for {path}"), "thresholds file")

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
        if merged and (merged[-1].backend, merged[-1].source, merged[-1].bitwise) == (r.backend, r.source, r.bitwise):
            merged[-1] = Range(merged[-1].lo, r.hi, r.backend, r.source, r.bitwise)
        else:
            merged.append(r)
    return tuple(merged)


def ranges_from_points(points: list[tuple]) -> tuple[Range, ...]:
    """Sorted (bytes, backend, source[, bitwise]) -> contiguous ranges with geometric-midpoint boundaries
    (calibrate and the start-up ladder place boundaries alike)."""
    ranges: list[Range] = []
    for i, (size, backend, source, *bits) in enumerate(points):
        bitwise = bits[0] if bits else None
        lo = 0 if i == 0 else int(math.ceil(math.sqrt(points[i - 1][0] * size)))
        if ranges and (ranges[-1].backend, ranges[-1].source, ranges[-1].bitwise) == (backend, source, bitwise):
            continue
        if ranges:
            ranges[-1] = Range(ranges[-1].lo, lo, ranges[-1].backend, ranges[-1].source, ranges[-1].bitwise)
        ranges.append(Range(lo, None, backend, source, bitwise))
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


#: The timing views a table may come from (the harness's views; "" in files that did not say).
VIEWS = ("", "eager", "isolated", "graph", "decode")
#: Largest margin a file may hold: a backend would have to be 100 times faster.
MAX_MARGIN = 100.0


def _backend_name(value, where: str) -> str:
    """A backend's name as written; whether this process knows it is the router's question (router.check_names)."""
    return schema.name(value, where)


def _range(value, where: str) -> Range:
    r = schema.known_keys(schema.table(value, where), where, ("lo", "hi", "backend"), ("source", "bitwise"))
    hi = None if r["hi"] is None else schema.size(r["hi"], f"{where}.hi")
    bitwise = r.get("bitwise")
    if bitwise is not None and not isinstance(bitwise, bool):
        raise FormatError(f"{where}.bitwise must be true, false or null")
    return Range(
        schema.size(r["lo"], f"{where}.lo"),
        hi,
        _backend_name(r["backend"], f"{where}.backend"),
        schema.string(r.get("source", "measured"), f"{where}.source", SOURCES),
        bitwise,
    )


def _table(value, where: str) -> Table:
    t = schema.known_keys(schema.table(value, where), where, ("op", "dtype", "world_size", "ranges", "mode"), ("run_id", "view"))
    return Table(
        schema.string(t["op"], f"{where}.op", OPS),
        schema.string(t["dtype"], f"{where}.dtype", DTYPES),
        schema.integer(t["world_size"], f"{where}.world_size", 1),
        schema.items(t["ranges"], f"{where}.ranges", _range),
        schema.string(t["mode"], f"{where}.mode", MODES),
        schema.string(t.get("run_id", ""), f"{where}.run_id"),
        schema.string(t.get("view", ""), f"{where}.view", VIEWS),
    )


def _model(value, where: str) -> Model:
    m = schema.known_keys(
        schema.table(value, where), where, ("backend", "op", "dtype", "world_size", "alpha_us", "bandwidth_gbps"), ("mode",)
    )
    return Model(
        _backend_name(m["backend"], f"{where}.backend"),
        schema.string(m["op"], f"{where}.op", OPS),
        schema.string(m["dtype"], f"{where}.dtype", DTYPES),
        schema.integer(m["world_size"], f"{where}.world_size", 1),
        schema.number(m["alpha_us"], f"{where}.alpha_us", hi=1e12),
        schema.optional_number(m["bandwidth_gbps"], f"{where}.bandwidth_gbps", lo=0.0, hi=1e9, lo_open=True),
        schema.string(m.get("mode", "eager"), f"{where}.mode", MODES),
    )


def _optional_strings(value, where: str) -> tuple[str, ...] | None:
    return None if value is None else schema.strings(value, where)


def _fingerprint(value, where: str) -> Fingerprint:
    f = schema.known_keys(schema.table(value, where), where, ("world_size",), [x.name for x in fields(Fingerprint)])
    return Fingerprint(
        schema.integer(f["world_size"], f"{where}.world_size"),
        schema.string(f.get("device_type", ""), f"{where}.device_type"),  # type: ignore[call-arg]
        schema.strings(f.get("hostnames", []), f"{where}.hostnames"),
        schema.strings(f.get("device_names", []), f"{where}.device_names"),
        *(schema.optional_string(f.get(k), f"{where}.{k}") for k in ("driver_version", "torch_version", "nccl_version")),  # type: ignore[arg-type]
        _optional_strings(f.get("rdma_devices"), f"{where}.rdma_devices"),
    )


def _source_run(value, where: str) -> SourceRun:
    r = schema.known_keys(schema.table(value, where), where, ("run_id", "fingerprint"))
    return SourceRun(schema.string(r["run_id"], f"{where}.run_id"), _fingerprint(r["fingerprint"], f"{where}.fingerprint"))


def _setup(value, where: str) -> BackendSetup:
    s = schema.known_keys(schema.table(value, where), where, (), ("options", "capacity"))
    capacity = schema.table(s.get("capacity", {}), f"{where}.capacity")
    return BackendSetup(
        dict(schema.table(s.get("options", {}), f"{where}.options")),
        {schema.string(op, f"{where}.capacity", OPS): schema.size(b, f"{where}.capacity.{op}") for op, b in capacity.items()},
    )


def _upgrade_v1(data: dict) -> dict:
    """A version-1 file as version 2: its one run, its one mode, no backend options."""
    schema.known_keys(data, "file", ("kind", "version", "baseline", "margin", "provenance", "tables"), ("models",))
    provenance = schema.table(data["provenance"], "provenance")
    mode = schema.string(provenance.get("mode", "eager"), "provenance.mode", MODES)
    run_id = schema.string(provenance.get("run_id", ""), "provenance.run_id")
    tables = [
        {**schema.table(t, f"tables[{i}]"), "mode": mode, "run_id": run_id, "view": mode}
        for i, t in enumerate(schema.items(data["tables"], "tables", lambda t, w: t))
    ]
    models = [
        {**schema.table(m, f"models[{i}]"), "mode": mode}
        for i, m in enumerate(schema.items(data.get("models", []), "models", lambda m, w: m))
    ]
    worlds = {t.get("world_size") for t in tables}
    world = provenance.get("world_size") or (worlds.pop() if len(worlds) == 1 else 0)
    runs = [
        {
            "run_id": run_id,
            "fingerprint": {
                "world_size": world,
                "device_type": provenance.get("device_type", ""),
                "hostnames": provenance.get("hostnames", []),
                "device_names": provenance.get("device_names", []),
            },
        }
    ]
    return {**data, "version": 2, "tables": tables, "models": models, "runs": runs, "backend_setup": {}}


def _build(data) -> Thresholds:
    """The typed file from parsed JSON; every field checked, every problem one FormatError naming the field."""
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise FormatError("not an arxtune thresholds file")
    version = data.get("version")
    if isinstance(version, bool) or version not in READABLE_VERSIONS:
        raise FormatError(f"version {schema._show(version)} is not supported (this arxtune reads {', '.join(map(str, READABLE_VERSIONS))})")
    if version == 1:
        data = _upgrade_v1(data)
    schema.known_keys(data, "file", ("kind", "version", "baseline", "margin", "provenance", "tables", "runs", "backend_setup"), ("models",))
    tables = schema.items(data["tables"], "tables", _table)
    setup = schema.table(data["backend_setup"], "backend_setup")
    return Thresholds(
        _backend_name(data["baseline"], "baseline"),
        schema.number(data["margin"], "margin", hi=MAX_MARGIN),
        dict(schema.table(data["provenance"], "provenance")),
        tables,
        schema.items(data.get("models", []), "models", _model),
        schema.items(data["runs"], "runs", _source_run),
        {_backend_name(n, "backend_setup"): _setup(s, f"backend_setup.{n}") for n, s in setup.items()},
    )


def from_dict(data: dict, source: str = "thresholds") -> Thresholds:
    """Validate and build; anything off (types, ranges, names, nesting) is one FormatError saying where."""
    try:
        schema.check_depth(data, "the file")
        result = _build(data)
    except FormatError as exc:
        raise _fail(source, str(exc)) from None
    seen = set()
    for t in result.tables:
        where = f"table {t.mode}/{t.op}/{t.dtype}/w{t.world_size}"
        if t.key in seen:
            raise _fail(source, f"{where} appears twice")
        seen.add(t.key)
        validate_ranges(t.ranges, where, source)
    return result


def is_thresholds_file(path: str | Path) -> bool:
    """Whether an existing file may be replaced by a thresholds file: it is one (of any version), or empty."""
    try:
        text = read_text(path, "thresholds file")
        return not text.strip() or schema.parse_json(text, str(path)).get("kind") == KIND
    except (ArxtuneError, AttributeError):
        return False


def load(path: str | Path) -> Thresholds:
    path = Path(path)
    try:
        check_exists(path, "thresholds file", f"; create it with `arxtune calibrate RUN --out {path}`")
        data = schema.parse_json(read_text(path, "thresholds file"), str(path))
    except FormatError:
        raise
    except ArxtuneError as exc:
        raise FormatError(str(exc)) from None
    return from_dict(data, str(path))
