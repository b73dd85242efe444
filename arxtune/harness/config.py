"""Sweep configuration: a typed dataclass, loaded from TOML, overridden by flags."""

from __future__ import annotations

import logging
import math
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from arxtune.runtime.backends import (
    OPS,
    check_options as check_backend_options,
    names as backend_names,
    problem as backend_problem,
    split_names,
    with_variants,
)
from arxtune.runtime.ops import DTYPES
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.units import format_bytes, parse_bytes
from arxtune.runtime import schema
from arxtune.runtime.fileio import check_exists, read_text

log = logging.getLogger("arxtune")

#: Timing views (timing.py); "mode" is the runtime's word (thresholds.MODES), not the sweep's.
VIEWS = ("eager", "isolated", "graph", "decode")
#: Longest busy kernel the decode view may put before each call, in microseconds.
MAX_DECODE_BUSY_US = 100_000.0
#: Largest size a sweep may ask for: input and output of a rank must both fit on one device.
MAX_BYTES_LIMIT = 16 << 30
#: Most sizes on one grid; a step factor barely above 1 would otherwise ask for millions.
MAX_GRID_SIZES = 200
#: Bounds that keep one sweep finite: rounds and samples per point, and any one wait or budget.
MAX_ROUNDS = 1000
MAX_ITERS = 10_000_000
MAX_SECONDS = 24 * 3600.0


@dataclass(frozen=True)
class SweepConfig:
    """What to measure and how long to spend on it."""

    backends: tuple[str, ...] = tuple(backend_names())
    """Backends to try; ones that cannot run here are recorded with the reason. A variant is named
    base[key=value,...], e.g. nccl[proto=LL,channels=4] (or listed in backend_options.nccl.variants)."""
    ops: tuple[str, ...] = OPS
    """Collectives to time: all_reduce, all_gather, reduce_scatter."""
    dtypes: tuple[str, ...] = ("float32", "bfloat16", "float16")
    """Element types; int32 is also available."""
    min_bytes: int = 1 << 10
    """Smallest size (all_reduce: one rank's input; gathers: total bytes)."""
    max_bytes: int = 16 << 20
    """Largest size, inclusive."""
    step_factor: float = 2.0
    """Ratio between consecutive sizes on the geometric grid."""
    views: tuple[str, ...] = ("eager", "isolated", "graph")
    """Timing views (timing.py): eager (back-to-back calls), isolated (one call, host cost included;
    on CPU, one call right after the barrier), graph (CUDA graphs, capturable backends only) and
    decode (each call behind a GPU busy kernel of decode_busy_us, no host sync; CUDA only)."""
    decode_busy_us: float = 50.0
    """The decode view's busy kernel before each call, in microseconds: the compute between two of a
    decode step's all-reduces on the target (about 50 for an 8B model at TP=2 on an H100)."""
    warmup_iters: int = 5
    """Untimed calls before timing each point."""
    rounds: int = 5
    """Timing rounds per point, interleaved across backends; intervals come from the spread across rounds."""
    max_extra_rounds: int = 10
    """Rounds a point may take beyond `rounds` while the baseline and a challenger are close (more
    rounds could change the decision rule's answer, runtime.faster.undecided); 0 takes none."""
    min_iters: int = 10
    """Fewest timed samples per point (over all rounds)."""
    max_iters: int = 2000
    """Most timed samples per point."""
    point_budget_s: float = 0.25
    """Time to spend sampling one point; the iteration count is chosen to fit it."""
    timeout_s: float = 120.0
    """Longest any collective or rendezvous may wait before the run fails."""
    baseline: str | None = None
    """Backend others must beat; default: nccl with CUDA tensors, else gloo."""
    out: str = "results"
    """Directory that receives one sub-directory per run."""
    nccl_pair_settings: bool = False
    """Before NCCL starts, each rank sets NCCL_IB_HCA, NCCL_IB_GID_INDEX and NCCL_SOCKET_IFNAME where they are
    unset, derived from its own RDMA devices as `arxtune doctor` prints them (both twins, the RoCE v2 IPv4 GID);
    the devices named in backend_options.arx when given, else every usable one."""
    backend_options: dict = field(default_factory=dict)
    """Per-backend options, e.g. {arx = {devices = ["rxe0"], max_bytes = "8MiB"}}; a `variants` list
    adds one backend per entry, e.g. {nccl = {variants = ["proto=LL", "proto=Simple,channels=4"]}}."""

    def __post_init__(self) -> None:
        bad = [p for p in map(backend_problem, self.backends) if p]
        if bad:
            raise ArxtuneError(f"backends: {'; '.join(bad)}")
        bad_ops = [o for o in self.ops if o not in OPS]
        if bad_ops:
            raise ArxtuneError(f"unknown op(s) {', '.join(bad_ops)}; known: {', '.join(OPS)}")
        bad_dtypes = [d for d in self.dtypes if d not in DTYPES]
        if bad_dtypes:
            raise ArxtuneError(f"unknown dtype(s) {', '.join(bad_dtypes)}; known: {', '.join(DTYPES)}")
        bad_views = [v for v in self.views if v not in VIEWS]
        if bad_views:
            raise ArxtuneError(f"unknown view(s) {', '.join(bad_views)}; known: {', '.join(VIEWS)}")
        if not (0 < self.min_bytes <= self.max_bytes):
            raise ArxtuneError("min_bytes must be positive and not above max_bytes")
        if self.max_bytes > MAX_BYTES_LIMIT:
            shown = format_bytes(self.max_bytes) if self.max_bytes < 1 << 60 else f"of {len(str(self.max_bytes))} digits"
            raise ArxtuneError(f"max_bytes {shown} is above {format_bytes(MAX_BYTES_LIMIT)}; no device holds that")
        if not (math.isfinite(self.step_factor) and self.step_factor > 1):
            raise ArxtuneError("step_factor must be a number greater than 1, e.g. 2")
        sizes = math.log(self.max_bytes / self.min_bytes) / math.log(self.step_factor) + 1
        if sizes > MAX_GRID_SIZES:
            raise ArxtuneError(
                f"step_factor {self.step_factor} gives {sizes:.0f} sizes (at most {MAX_GRID_SIZES}); use a larger step_factor"
            )
        if not 1 <= self.rounds <= MAX_ROUNDS:
            raise ArxtuneError(f"rounds must be between 1 and {MAX_ROUNDS} (5 or more gives intervals from the spread across rounds)")
        if not 0 <= self.max_extra_rounds <= MAX_ROUNDS:
            raise ArxtuneError(f"max_extra_rounds must be between 0 and {MAX_ROUNDS} (0: no extra rounds where a decision is close)")
        if not (1 <= self.min_iters <= self.max_iters <= MAX_ITERS):
            raise ArxtuneError(f"need 1 <= min_iters <= max_iters <= {MAX_ITERS}")
        if not all(math.isfinite(v) and v > 0 for v in (self.point_budget_s, self.timeout_s)) or not 0 <= self.warmup_iters <= MAX_ITERS:
            raise ArxtuneError(f"point_budget_s and timeout_s must be positive numbers, warmup_iters from 0 to {MAX_ITERS}")
        if not (math.isfinite(self.decode_busy_us) and 1 <= self.decode_busy_us <= MAX_DECODE_BUSY_US):
            raise ArxtuneError(f"decode_busy_us must be a number of microseconds from 1 to {MAX_DECODE_BUSY_US:.0f}, e.g. 50")
        if self.point_budget_s > MAX_SECONDS or self.timeout_s > MAX_SECONDS:
            raise ArxtuneError(f"point_budget_s and timeout_s must be at most {MAX_SECONDS:.0f} s")
        if not self.out:
            raise ArxtuneError("out is empty; give a directory (default results/)")
        if not (self.backends and self.ops and self.dtypes and self.views):
            raise ArxtuneError("backends, ops, dtypes and views must each name at least one entry")
        if self.baseline is not None and (why := backend_problem(self.baseline)):
            raise ArxtuneError(f"unknown baseline {self.baseline!r} ({why})")
        bad_options = [k for k, v in self.backend_options.items() if not isinstance(v, dict)]
        if bad_options:
            raise ArxtuneError(f"backend_options.{bad_options[0]} must be a table, e.g. {{arx = {{devices = [\"rxe0\"]}}}}")
        unknown_options = [k for k in self.backend_options if k not in backend_names()]
        if unknown_options:
            raise ArxtuneError(f"backend_options.{unknown_options[0]}: unknown backend; known: {', '.join(backend_names())}")
        for name, options in self.backend_options.items():  # each backend checks its own, even where it cannot run
            try:
                check_backend_options(name, options)
            except (ArxtuneError, TypeError, ValueError, OverflowError) as exc:
                raise ArxtuneError(f"backend_options.{name}: {' '.join(str(exc).split())}") from None
        self.timed_backends()

    def timed_backends(self) -> tuple[str, ...]:
        """`backends` with each one's variants (backend_options.NAME.variants) after it: what the sweep opens."""
        try:
            return with_variants(self.backends, self.backend_options)
        except (ValueError, KeyError) as exc:
            raise ArxtuneError(f"backend_options: {exc}") from None

    def with_overrides(self, **overrides) -> "SweepConfig":
        """A copy with the given fields replaced; None means 'keep'."""
        return from_mapping({**self.to_dict(), **{k: v for k, v in overrides.items() if v is not None}})

    def to_dict(self) -> dict:
        return asdict(self)


_LIST_FIELDS = {"backends", "ops", "dtypes", "views"}
#: Keys of earlier versions, still read: old key -> its name now.
_OLD_KEYS = {"modes": "views"}
_SIZE_FIELDS = {"min_bytes", "max_bytes"}
#: field -> (accepted Python types, what to write instead); lists and sizes are handled above these.
_TYPES = {
    "step_factor": ((int, float), "a number"),
    "point_budget_s": ((int, float), "a number"),
    "decode_busy_us": ((int, float), "a number"),
    "timeout_s": ((int, float), "a number"),
    "warmup_iters": ((int,), "a whole number"),
    "min_iters": ((int,), "a whole number"),
    "max_iters": ((int,), "a whole number"),
    "rounds": ((int,), "a whole number"),
    "max_extra_rounds": ((int,), "a whole number"),
    "baseline": ((str, type(None)), "a backend name"),
    "out": ((str,), "a directory path"),
    "backend_options": ((dict,), "a table of per-backend tables"),
    "nccl_pair_settings": ((bool,), "true or false"),
}


def _coerce(key: str, value):
    """One field's value in the type SweepConfig holds, or an ArxtuneError naming the key."""
    if key in _LIST_FIELDS:
        items = split_names(value) if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) for v in items):
            raise ArxtuneError(f"bad config value: {key} must be a list of names, e.g. {key} = [\"a\", \"b\"]")
        return tuple(v.strip() for v in items)
    if key in _SIZE_FIELDS:
        if isinstance(value, bool) or not isinstance(value, (int, str)):
            raise ArxtuneError(f"bad config value: {key} must be a size like 4096 or \"16MiB\"")
        try:
            return parse_bytes(value)
        except ArxtuneError as exc:
            raise ArxtuneError(f"bad config value: {key}: {exc}") from None
    types, expected = _TYPES[key]
    if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
        raise ArxtuneError(f"bad config value: {key} must be {expected}, not {value!r}")
    return value


def from_mapping(data: dict) -> SweepConfig:
    if not isinstance(data, dict):
        raise ArxtuneError("bad config: the sweep settings must be a table")
    schema.check_depth(data, "config")
    unnamed = (
        [k for k in data.get("backend_options", {}) if not isinstance(k, str) or not k.isidentifier()]
        if isinstance(data.get("backend_options"), dict)
        else []
    )
    if unnamed:
        raise ArxtuneError(f"backend_options.{unnamed[0]!r} is not a backend name")
    for old, new in _OLD_KEYS.items():
        if old in data:
            if new in data:
                raise ArxtuneError(f"config key {old} is the old name of {new}; give only {new}")
            data = {(new if key == old else key): value for key, value in data.items()}
    known = {f.name for f in fields(SweepConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ArxtuneError(f"unknown config key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return SweepConfig(**{key: _coerce(key, value) for key, value in data.items()})


def load_config(path: str | Path, warn: bool = True) -> SweepConfig:
    """Read a TOML sweep config; its [sweep] table (or top level) holds SweepConfig fields.

    An empty file is every default, said in a warning (`warn`: whether this process is the one to say it)."""
    path = check_exists(path, "config", "; see configs/sweep/ for examples")
    try:
        text = read_text(path, "config")
        if warn and not text.strip():
            log.warning("arxtune: config %s is empty: every setting takes its default, as with no --config", path)
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ArxtuneError(f"config {path} is not valid TOML ({' '.join(str(exc).split())}); fix the file") from None
    except (ValueError, RecursionError) as exc:  # numbers of too many digits, nesting past the stack
        raise ArxtuneError(f"config {path} is not a sweep config ({type(exc).__name__}); fix the file") from None
    try:
        return from_mapping(data.get("sweep", data))
    except ArxtuneError as exc:
        raise ArxtuneError(f"config {path}: {exc}") from None


__all__ = ["SweepConfig", "load_config", "from_mapping", "parse_bytes", "format_bytes", "replace"]
