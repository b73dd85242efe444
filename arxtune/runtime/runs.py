"""Run storage: one directory per run, a meta.json and an append-only points.csv; read and written without pandas.

The sweep appends to a run as it goes (RunWriter); the start-up ladder writes
its run whole (write_run); both make the directory with `new_run_dir`. Numbers
JSON or the reader cannot hold (inf, nan) are refused when written.

points.csv gets one line per measured point, flushed as soon as the point is
done, so an interrupted sweep keeps every finished point and `--resume`
continues it. Raw per-iteration samples (max across ranks) are stored, not
only summaries, with the number of samples each timing round contributed
(`round_iters`); summaries are derived on load.

Format history:
- version 1: meta.json + points.csv; one block of samples per point.
- version 2: points.csv gains `round_iters`: samples come in rounds
  interleaved across backends, and intervals come from the spread across
  rounds. Version 1 runs are refused (their intervals are not comparable).
- version 3: points.csv's `mode` column is named `view` (how a point was
  timed: eager, isolated, graph; "mode" is the runtime's word), and the
  config's `modes` key is `views`. Version 2 runs are still read, resumed and
  appended to in their own format.
- version 4: meta.json gains `nccl_used`: per rank, what NCCL logged it used
  (network, HCAs, GID index, channels, transports; nccl_facts.parse_log). Points
  are as in version 3; versions 2 and 3 are still read, resumed and appended to.
- version 5: points.csv gains `bitwise` (1 or 0: whether the backend's output
  on random non-integer data had the baseline's bits; empty: not checked).
  Runs of versions 2 to 4 are still read (bitwise unknown), resumed and
  appended to in their own format.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
import os
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path

from arxtune.runtime.ops import DTYPES, OP_SPECS
from arxtune.runtime import schema
from arxtune.runtime.errors import ArxtuneError, FormatError
from arxtune.runtime.fileio import Staged, WriterLock, check_exists, ensure_dir, read_text, write_text_atomic
from arxtune.runtime.timing import TIMERS

FORMAT_VERSION = 5
#: Versions this arxtune reads; a run keeps its version (and header) when resumed.
READABLE_VERSIONS = (2, 3, 4, 5)
META_FILE = "meta.json"
POINTS_FILE = "points.csv"
_V3_COLUMNS = ["backend", "op", "dtype", "view", "size", "nbytes", "world_size", "status", "iters", "round_iters", "samples_us", "error"]
POINT_COLUMNS = _V3_COLUMNS + ["bitwise"]
#: points.csv's header in each readable version (the columns keep their order; a newer version only adds at the end).
HEADERS = {5: POINT_COLUMNS, 4: _V3_COLUMNS, 3: _V3_COLUMNS, 2: [("mode" if c == "view" else c) for c in _V3_COLUMNS]}
#: The bitwise column's text: checked equal, checked different, not checked.
_BITWISE_TEXT = {True: "1", False: "0", None: ""}
STATUSES = ("ok", "wrong", "error", "unsupported")
#: points.csv of the largest sweeps stays far below this.
POINTS_FILE_LIMIT = 1 << 30
log = logging.getLogger("arxtune")


def now() -> str:
    """A run's started/finished stamp: UTC, to the second."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def new_run_dir(parent: Path, name: str) -> Path:
    """Make `parent/name`, which must not exist yet (mkdir is the lock two runs of one id race for)."""
    path = parent / name
    try:
        path.mkdir()
    except FileExistsError:
        raise RunExists(f"{path} already exists") from None
    except OSError as exc:
        raise ArxtuneError(f"cannot create run directory {path} ({exc.strerror}); choose another --out") from None
    return path


#: How a point can be timed (the harness's views; a table's mode is timed by the view of its name).
VIEWS = tuple(dict.fromkeys(view for _, view in TIMERS))


@dataclass(frozen=True)
class PointRecord:
    """One (backend, op, dtype, view, size) measurement as stored."""

    backend: str
    op: str
    dtype: str
    view: str
    size: int  # the grid size asked for
    nbytes: int  # the bytes actually moved (rounded to whole elements per rank)
    world_size: int
    status: str  # ok | wrong (failed the check) | error (raised) | unsupported
    samples_us: tuple[float, ...] = ()  # every round's samples, in order
    error: str = ""
    round_iters: tuple[int, ...] = ()  # samples per round; sums to len(samples_us)
    bitwise: bool | None = None  # its output on random data had the baseline's bits (None: not checked; harness/bitwise.py)

    @property
    def key(self) -> tuple:
        return (self.backend, self.op, self.dtype, self.view, self.size)

    def to_row(self) -> list:
        if not all(math.isfinite(s) for s in self.samples_us):
            raise ArxtuneError(f"point {self.key} holds a sample that is not finite; it is not written")
        return [
            self.backend,
            self.op,
            self.dtype,
            self.view,
            self.size,
            self.nbytes,
            self.world_size,
            self.status,
            len(self.samples_us),
            " ".join(map(str, self.round_iters)),
            " ".join(f"{s:.3f}" for s in self.samples_us),
            " ".join(self.error.split()),
            _BITWISE_TEXT[self.bitwise],
        ]


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
    nccl_used: list[dict] | None = None  # per rank, what NCCL logged it used (version 4; None: not recorded, or CPU)

    @classmethod
    def from_dict(cls, data, source: Path | str) -> "RunMeta":
        """The typed meta.json: every field checked (type, range, known names), any problem one FormatError."""
        try:
            schema.check_depth(data, "meta.json")
            return cls._build(data)
        except FormatError as exc:
            raise FormatError(f"{source}: {exc}; the run is corrupt") from None

    @classmethod
    def _build(cls, data) -> "RunMeta":
        data = schema.table(data, "meta.json")
        version = data.get("version")
        if isinstance(version, bool) or version not in READABLE_VERSIONS:
            raise FormatError(
                f"results format version {schema._show(version)} is not supported (this arxtune reads "
                f"{', '.join(map(str, READABLE_VERSIONS))}: samples timed in interleaved rounds); re-run the sweep with this arxtune"
            )
        schema.known_keys(
            data, "meta.json", ("run_id", "world_size", "device_type", "config", "baseline", "started"), [f.name for f in fields(cls)]
        )
        text, strings = schema.string, schema.strings
        return cls(
            run_id=schema.string(data["run_id"], "run_id", empty=False),
            world_size=schema.integer(data["world_size"], "world_size", 1),
            device_type=text(data["device_type"], "device_type"),
            config=_meta_config(data["config"]),
            baseline=schema.name(data["baseline"], "baseline"),
            started=text(data["started"], "started"),
            version=version,
            finished=schema.optional_string(data.get("finished"), "finished"),
            arxtune_version=text(data.get("arxtune_version", ""), "arxtune_version"),
            torch_version=text(data.get("torch_version", ""), "torch_version"),
            nccl_version=schema.optional_string(data.get("nccl_version"), "nccl_version"),
            driver_version=schema.optional_string(data.get("driver_version"), "driver_version"),
            rdma_devices=list(strings(data.get("rdma_devices", []), "rdma_devices")),
            hostnames=list(strings(data.get("hostnames", []), "hostnames")),
            device_names=list(strings(data.get("device_names", []), "device_names")),
            backends={
                schema.name(n, "backends"): _backend_status(s, f"backends.{n}")
                for n, s in schema.table(data.get("backends", {}), "backends").items()
            },
            fabric_floor_us=schema.optional_number(data.get("fabric_floor_us"), "fabric_floor_us", lo=0.0, lo_open=True),
            command=text(data.get("command", ""), "command"),
            nccl_used=_nccl_used(data.get("nccl_used")),
        )


#: Largest step between grid sizes a run may record (calibrate extends tables by it).
MAX_STEP_FACTOR = 1e6


def _meta_config(value) -> dict:
    """The sweep config a run recorded: what readers use is checked here; resume checks all of it (config.from_mapping)."""
    config = schema.table(value, "config")
    if "step_factor" in config:
        schema.number(config["step_factor"], "config.step_factor", lo=1.0, hi=MAX_STEP_FACTOR, lo_open=True)
    return config


def _nccl_used(value) -> list[dict] | None:
    """meta.json's nccl_used: null, or one object per rank; the fields readers use (calibrate, show) are checked."""
    if value is None:
        return None
    records = list(schema.items(value, "nccl_used", schema.table))
    for i, rec in enumerate(records):
        where = f"nccl_used[{i}]"
        schema.optional_string(rec.get("error"), f"{where}.error")
        schema.strings(rec.get("devices", []), f"{where}.devices")
        for j, comm in enumerate(schema.items(rec.get("communicators", []), f"{where}.communicators", schema.table)):
            schema.strings(comm.get("transports", []), f"{where}.communicators[{j}].transports")
            schema.strings(comm.get("hcas_used", []), f"{where}.communicators[{j}].hcas_used")
    return records


def _backend_status(value, where: str) -> dict:
    """One backend's line in meta.json: available, why not, and how it was opened."""
    status = schema.known_keys(schema.table(value, where), where, ("available",), ("reason", "capturable", "ops", "capacity", "options"))
    if not isinstance(status["available"], bool) or not isinstance(status.get("capturable", False), bool):
        raise FormatError(f"{where}.available and .capturable must be true or false")
    schema.string(status.get("reason", ""), f"{where}.reason")
    schema.items(status.get("ops", []), f"{where}.ops", lambda v, w: schema.string(v, w, OP_SPECS))
    for op, limit in schema.table(status.get("capacity", {}), f"{where}.capacity").items():
        schema.string(op, f"{where}.capacity", OP_SPECS)
        schema.size(limit, f"{where}.capacity.{op}")
    schema.table(status.get("options", {}), f"{where}.options")
    return status


def _write_json_atomic(path: Path, data: dict) -> None:
    """The loader refuses numbers JSON cannot hold (inf, nan): refuse them here too, before the file is replaced."""
    try:
        text = json.dumps(data, indent=2, sort_keys=True, allow_nan=False)
    except ValueError as exc:
        raise ArxtuneError(f"run metadata for {path} holds a number that is not finite ({exc}); {path} is left as it was") from None
    write_text_atomic(path, text + "\n", "run metadata")


class RunWriter:
    """Appends points to a run directory as they finish. Only rank 0 uses it, holding the run's writer lock
    (fileio.WriterLock) from before its first write until `close()`: two sweeps never append to one run."""

    def __init__(self, path: Path, meta: RunMeta, done: dict[tuple, PointRecord], lock: WriterLock):
        self.path = path
        self.meta = meta
        self.done = done
        self.lock = lock
        self._file = open(path / POINTS_FILE, "a", newline="")
        self._csv = csv.writer(self._file)
        self._columns = len(HEADERS[meta.version])  # a resumed older run is appended to in its own format

    @classmethod
    def create(cls, out_dir: str | Path, meta: RunMeta) -> "RunWriter":
        """Make the run directory; it must not exist yet (mkdir is the lock two sweeps of one id race for)."""
        try:
            path = new_run_dir(ensure_dir(out_dir, "--out directory"), meta.run_id)
        except RunExists as exc:
            raise RunExists(f"{exc}; pick another --run-id" + _continue_hint(Path(out_dir) / meta.run_id)) from None
        lock = WriterLock(path, f"run {path}").acquire()
        try:
            with open(path / POINTS_FILE, "w", newline="") as handle:
                csv.writer(handle).writerow(POINT_COLUMNS)
            _write_json_atomic(path / META_FILE, asdict(meta))
            return cls(path, meta, {}, lock)
        except BaseException:
            lock.release()
            raise

    @classmethod
    def resume(cls, path: str | Path) -> "RunWriter":
        """Reopen an interrupted run. Only a torn last line is cut (and said so); every complete line stays byte for byte."""
        lock = WriterLock(path, f"run {path}").acquire()
        try:
            run = resumable(path)  # read under the lock: no other writer appends while it is read and continued
            if run.torn_line:
                points = run.path / POINTS_FILE
                os.truncate(points, points.stat().st_size - len(run.torn_line.encode("utf-8")))
                log.warning("arxtune: %s: cut a torn last line (an interrupted write); that point is measured again", points)
            return cls(run.path, run.meta, {record.key: record for record in run.records}, lock)
        except BaseException:
            lock.release()
            raise

    def append(self, record: PointRecord) -> None:
        self.append_group([record])

    def append_group(self, records: list[PointRecord]) -> None:
        """The backends timed together at one point, written and flushed at once."""
        self._csv.writerows(record.to_row()[: self._columns] for record in records)
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done.update((record.key, record) for record in records)

    def write_meta(self) -> None:
        _write_json_atomic(self.path / META_FILE, asdict(self.meta))

    def close(self) -> None:
        self._file.close()
        self.lock.release()


def _meta_text(path: Path, meta: RunMeta) -> str:
    try:
        return json.dumps(asdict(meta), indent=2, sort_keys=True, allow_nan=False) + "\n"
    except ValueError as exc:
        raise ArxtuneError(f"run metadata for {path} holds a number that is not finite ({exc}); {path} is left as it was") from None


def write_run(out_dir: Path, meta: RunMeta, records: list[PointRecord]) -> Path:
    """A whole run at once (meta.json and points.csv together, or nothing) in a new directory out_dir/run_id."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(POINT_COLUMNS)
    writer.writerows(record.to_row() for record in records)
    meta_text = _meta_text(out_dir / meta.run_id / META_FILE, meta)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = new_run_dir(out_dir, meta.run_id)
    try:
        with Staged() as staged:
            staged.write_text(path / POINTS_FILE, text.getvalue(), "run points")
            staged.write_text(path / META_FILE, meta_text, "run metadata")
    except BaseException:
        if not any(path.iterdir()):
            path.rmdir()
        raise
    return path


def _continue_hint(path: Path) -> str:
    """' or continue it with --resume PATH' where that would work: never for a finished run or another kind of folder."""
    try:
        return "" if read_meta(path).finished else f" or continue it with --resume {path}"
    except ArxtuneError:
        return ""


class RunExists(ArxtuneError):
    """The run directory is already there (another sweep of the same id, or an old run)."""


@dataclass
class Run:
    path: Path
    meta: RunMeta
    records: list[PointRecord]
    torn_line: str = ""  # an incomplete last line of points.csv (an interrupted write), not part of records


def _parse_samples(text: str) -> tuple[float, ...]:
    return tuple(float(v) for v in text.split()) if text else ()


def _row_problem(record: PointRecord, iters: int, meta: RunMeta) -> str:
    """Why a parsed row cannot be part of this run ('' when it can)."""
    if meta.backends and record.backend not in meta.backends:
        return f"backend {record.backend!r} is not one of the run's ({', '.join(meta.backends)})"
    if record.op not in OP_SPECS or record.dtype not in DTYPES or record.view not in VIEWS or record.status not in STATUSES:
        return "unknown op, dtype, view or status"
    if not (0 < record.size <= schema.MAX_SIZE_BYTES and 0 < record.nbytes <= schema.MAX_SIZE_BYTES):
        return f"sizes must be positive and at most {schema.MAX_SIZE_BYTES}"
    if record.world_size != meta.world_size:
        return f"world size {record.world_size} in a run of world size {meta.world_size}"
    if iters != len(record.samples_us) or (record.status == "ok") != bool(record.samples_us):
        return "sample count does not match"
    if record.round_iters and (sum(record.round_iters) != iters or min(record.round_iters) < 1):
        return "round sizes do not add up to the sample count"
    if not all(math.isfinite(s) and s > 0 for s in record.samples_us):
        return "samples must be positive, finite times"
    if record.bitwise is not None and record.status != "ok":
        return "only a point that passed has a bitwise check"
    return ""


def _parse_bitwise(text: str) -> bool | None:
    for value, written in _BITWISE_TEXT.items():
        if text == written:
            return value
    raise ValueError(f"bitwise must be 1, 0 or empty, not {text!r}")


def _parse_row(row: list[str], where: str, meta: RunMeta) -> PointRecord:
    """One points.csv line -> a validated PointRecord; anything off is a FormatError naming the line."""
    columns = len(HEADERS[meta.version])
    if len(row) != columns:
        raise FormatError(f"{where}: {len(row)} fields, expected {columns}; the run is corrupt")
    try:
        padded = row + [""] * (len(POINT_COLUMNS) - columns)  # an older version has no bitwise column: not checked
        backend, op, dtype, view, size, nbytes, world, status, iters, round_iters, samples, error, bitwise = padded
        record = PointRecord(
            backend,
            op,
            dtype,
            view,
            int(size),
            int(nbytes),
            int(world),
            status,
            _parse_samples(samples),
            error,
            tuple(int(v) for v in round_iters.split()),
            _parse_bitwise(bitwise),
        )
        problem = _row_problem(record, int(iters), meta)
    except ValueError as exc:
        raise FormatError(f"{where}: {exc}; the run is corrupt") from None
    if problem:
        raise FormatError(f"{where}: {problem}; the run is corrupt")
    return record


def _read_points(points_path: Path, meta: RunMeta) -> tuple[list[PointRecord], str]:
    """(records, torn last line). Only text after the last newline counts as torn; damage anywhere else is an error."""
    text = read_text(points_path, "points file", POINTS_FILE_LIMIT)
    cut = text.rfind("\n") + 1
    complete, torn = text[:cut], text[cut:]
    reader = csv.reader(io.StringIO(complete, newline=""), strict=True)
    line = 1  # where the row being read starts: a quote left open is reported where it opened
    try:
        if next(reader, None) != HEADERS[meta.version]:
            raise FormatError(f"{points_path} has unexpected columns; the run is corrupt or from another version")
        records, seen = [], set()
        while (line := reader.line_num + 1) and (row := next(reader, None)) is not None:
            record = _parse_row(row, f"{points_path}:{line}", meta)
            if record.key in seen:
                raise FormatError(f"{points_path}:{line}: point {record.key} appears twice; the run is corrupt")
            seen.add(record.key)
            records.append(record)
    except csv.Error as exc:
        raise FormatError(f"{points_path}:{line}: {exc}; the run is corrupt (only a torn last line may be cut)") from None
    return records, torn


def read_meta(path: str | Path) -> RunMeta:
    """A run directory's meta.json alone, validated."""
    meta_path = Path(path) / META_FILE
    try:
        data = schema.parse_json(read_text(meta_path, "run metadata"), str(meta_path))
    except FormatError as exc:
        raise FormatError(f"{exc}; the run is corrupt") from None
    except ArxtuneError as exc:
        raise FormatError(str(exc)) from None
    return RunMeta.from_dict(data, meta_path)


def load_run(path: str | Path) -> Run:
    """Read a run directory; a missing, corrupt or unknown-version run is a FormatError."""
    path = Path(path)
    try:
        check_exists(path, "run directory")
    except ArxtuneError as exc:
        raise FormatError(f"{path} is not an arxtune run ({str(exc).removeprefix(f'run directory {path} ')})") from None
    meta_path, points_path = path / META_FILE, path / POINTS_FILE
    if not meta_path.is_file() or not points_path.is_file():
        raise FormatError(f"{path} is not an arxtune run (needs {META_FILE} and {POINTS_FILE}); pass a directory under results/")
    meta = read_meta(path)
    try:
        records, torn = _read_points(points_path, meta)
    except FormatError:
        raise
    except ArxtuneError as exc:
        raise FormatError(str(exc)) from None
    if torn:
        log.warning("arxtune: %s ends in a torn line (an interrupted write); it is ignored, and cut on --resume", points_path)
    return Run(path, meta, records, torn)


def resumable(path: str | Path) -> Run:
    """The run at `path` if it can be continued: readable and not finished."""
    run = load_run(path)
    if run.meta.finished:
        raise ArxtuneError(
            f"run {run.path} finished at {run.meta.finished}; nothing to resume (start a new sweep, or `arxtune calibrate {run.path}`)"
        )
    return run
