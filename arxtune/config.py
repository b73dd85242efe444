"""Sweep configuration: a typed dataclass, loaded from TOML, overridden by flags."""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path

from .backends import OPS, names as backend_names
from .collectives import DTYPES
from .errors import ArxtuneError

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}
MODES = ("eager", "isolated", "graph")


def parse_bytes(value: int | str) -> int:
    """'64KiB', '16M', 4096 -> bytes (binary units)."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", str(value))
    if not match or match.group(2).upper() not in _UNITS:
        raise ArxtuneError(f"cannot read size {value!r}: use bytes or a unit like 64KiB, 16MiB")
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_bytes(nbytes: float) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f}{unit}" if value == int(value) else f"{value:.1f}{unit}"
    return f"{nbytes:.0f}B"


@dataclass(frozen=True)
class SweepConfig:
    """What to measure and how long to spend on it."""

    backends: tuple[str, ...] = tuple(backend_names())
    """Backends to try; ones that cannot run here are recorded with the reason."""
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
    modes: tuple[str, ...] = ("eager", "isolated", "graph")
    """Timing views (timing.py): eager (back-to-back calls), isolated (one call, host cost included;
    CUDA only, as CPU calls are synchronous) and graph (CUDA graphs, capturable backends only)."""
    warmup_iters: int = 5
    """Untimed calls before timing each point."""
    rounds: int = 5
    """Timing rounds per point, interleaved across backends; intervals come from the spread across rounds."""
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
    backend_options: dict = field(default_factory=dict)
    """Per-backend options, e.g. {arx = {devices = ["rxe0"], max_bytes = "8MiB"}}."""

    def __post_init__(self) -> None:
        unknown = [b for b in self.backends if b not in backend_names()]
        if unknown:
            raise ArxtuneError(f"unknown backend(s) {', '.join(unknown)}; known: {', '.join(backend_names())}")
        bad_ops = [o for o in self.ops if o not in OPS]
        if bad_ops:
            raise ArxtuneError(f"unknown op(s) {', '.join(bad_ops)}; known: {', '.join(OPS)}")
        bad_dtypes = [d for d in self.dtypes if d not in DTYPES]
        if bad_dtypes:
            raise ArxtuneError(f"unknown dtype(s) {', '.join(bad_dtypes)}; known: {', '.join(DTYPES)}")
        bad_modes = [m for m in self.modes if m not in MODES]
        if bad_modes:
            raise ArxtuneError(f"unknown mode(s) {', '.join(bad_modes)}; known: {', '.join(MODES)}")
        if not (0 < self.min_bytes <= self.max_bytes):
            raise ArxtuneError("min_bytes must be positive and not above max_bytes")
        if self.step_factor <= 1:
            raise ArxtuneError("step_factor must be greater than 1")
        if self.rounds < 1:
            raise ArxtuneError("rounds must be at least 1 (5 or more gives intervals from the spread across rounds)")
        if not (1 <= self.min_iters <= self.max_iters):
            raise ArxtuneError("need 1 <= min_iters <= max_iters")
        if self.point_budget_s <= 0 or self.timeout_s <= 0 or self.warmup_iters < 0:
            raise ArxtuneError("point_budget_s and timeout_s must be positive, warmup_iters not negative")
        if not (self.backends and self.ops and self.dtypes and self.modes):
            raise ArxtuneError("backends, ops, dtypes and modes must each name at least one entry")

    def with_overrides(self, **overrides) -> "SweepConfig":
        """A copy with the given fields replaced; None means 'keep'."""
        return from_mapping({**self.to_dict(), **{k: v for k, v in overrides.items() if v is not None}})

    def to_dict(self) -> dict:
        return asdict(self)


_LIST_FIELDS = {"backends", "ops", "dtypes", "modes"}
_SIZE_FIELDS = {"min_bytes", "max_bytes"}


def from_mapping(data: dict) -> SweepConfig:
    known = {f.name for f in fields(SweepConfig)}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ArxtuneError(f"unknown config key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    values = dict(data)
    for key in _LIST_FIELDS & values.keys():
        value = values[key]
        values[key] = tuple(value.split(",") if isinstance(value, str) else value)
    for key in _SIZE_FIELDS & values.keys():
        values[key] = parse_bytes(values[key])
    try:
        return SweepConfig(**values)
    except TypeError as exc:
        raise ArxtuneError(f"bad config value: {exc}") from exc


def load_config(path: str | Path) -> SweepConfig:
    """Read a TOML sweep config; its [sweep] table (or top level) holds SweepConfig fields."""
    path = Path(path)
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ArxtuneError(f"config {path} not found; see configs/sweep/ for examples") from None
    except tomllib.TOMLDecodeError as exc:
        raise ArxtuneError(f"config {path} is not valid TOML ({exc}); fix the file") from None
    try:
        return from_mapping(data.get("sweep", data))
    except ArxtuneError as exc:
        raise ArxtuneError(f"config {path}: {exc}") from None


__all__ = ["SweepConfig", "load_config", "from_mapping", "parse_bytes", "format_bytes", "replace"]
