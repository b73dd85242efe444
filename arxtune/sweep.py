"""The harness: every rank runs this under torchrun; only rank 0 writes.

Per point: check the result against an exact reference, warm up, choose the
iteration count from a short estimate so sampling fits the point's budget,
then time each iteration with all ranks released together by a barrier and
keep the slowest rank's time per iteration.
"""

from __future__ import annotations

import logging
import platform
import shlex
import sys
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import torch.distributed as dist

from . import __version__, distributed
from .backends import OPS, Backend, GroupContext
from .backends.startup import agreed_reason, default_baseline, open_backends  # noqa: F401 (re-exported)
from .collectives import DTYPES, OP_SPECS, elements_per_rank, expected_output, make_input, mismatch, size_grid
from .config import SweepConfig, format_bytes, from_mapping
from .errors import ArxtuneError
from .results import PointRecord, RunMeta, RunWriter
from .timing import make_timer

ESTIMATE_CALLS = 3
log = logging.getLogger("arxtune")


@dataclass(frozen=True)
class Point:
    backend: str
    op: str
    dtype: str
    mode: str
    size: int

    @property
    def key(self) -> tuple:
        return (self.backend, self.op, self.dtype, self.mode, self.size)


def new_run_id(world_size: int, device_type: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{platform.node() or 'host'}-w{world_size}-{device_type}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def fabric_floor_us(ready: dict[str, Backend]) -> float | None:
    """ib_write_lat's 2-byte latency on arx's device, the floor every RDMA backend is plotted against.

    Only where an arx backend runs; None (and the sweep goes on) when perftest cannot measure it.
    """
    arx = next((ready[name] for name in ("arx", "arx2") if name in ready), None)
    if arx is None:
        return None
    from .rdma.floor import measure_write_latency_us

    devices = getattr(arx.cfg, "devices", None)
    try:
        return measure_write_latency_us(devices[0] if devices else None, timeout_s=60)
    except ArxtuneError as exc:
        log.warning("arxtune: no fabric floor: %s", exc)
        return None


def plan_points(config: SweepConfig, ready: dict[str, Backend], device: torch.device) -> list[Point]:
    sizes = size_grid(config.min_bytes, config.max_bytes, config.step_factor)
    points = []
    for name, backend in ready.items():
        for mode in config.modes:
            if mode == "graph" and (device.type != "cuda" or not backend.capturable):
                continue
            for op in [o for o in config.ops if o in getattr(backend, "ops", OPS)]:
                for dtype in config.dtypes:
                    points.extend(Point(name, op, dtype, mode, size) for size in sizes)
    return points


class PointRunner:
    """Measures one point on every rank; returns the same PointRecord everywhere."""

    def __init__(self, config: SweepConfig, ctx: GroupContext):
        self.config = config
        self.ctx = ctx

    def _sync(self) -> None:
        if self.ctx.device.type == "cuda":
            torch.cuda.synchronize(self.ctx.device)

    def _agree_outcome(self, point: Point, nbytes: int, local: tuple[str, str]) -> PointRecord | None:
        """If any rank failed, every rank returns the same failure record ('error' outranks 'wrong')."""
        outcomes = distributed.gather_objects(local, self.ctx.cpu_group)
        failed = [(status, f"rank {r}: {message}") for r, (status, message) in enumerate(outcomes) if status != "ok"]
        if not failed:
            return None
        status = "error" if any(s == "error" for s, _ in failed) else "wrong"
        return PointRecord(*point.key, nbytes=nbytes, world_size=self.ctx.world_size, status=status,
                           error="; ".join(m for _, m in failed))

    def measure(self, point: Point, backend: Backend) -> PointRecord:
        ctx = self.ctx
        dtype = DTYPES[point.dtype]
        spec = OP_SPECS[point.op]
        n = elements_per_rank(point.op, point.size, ctx.world_size, dtype.itemsize)
        nbytes = spec.nbytes(n, ctx.world_size, dtype.itemsize)
        if not distributed.all_true(backend.supports(point.op, dtype, nbytes), ctx.cpu_group):
            return PointRecord(*point.key, nbytes=nbytes, world_size=ctx.world_size, status="unsupported",
                               error=f"{point.backend} does not support {point.op} {point.dtype} at {nbytes} bytes")
        inp = make_input(point.op, n, ctx.rank, ctx.world_size, dtype, ctx.device)
        out = torch.zeros(spec.shapes(n, ctx.world_size)[1], dtype=dtype, device=ctx.device)
        expected = expected_output(point.op, n, ctx.rank, ctx.world_size, dtype)
        call = getattr(backend, point.op)

        def op() -> None:
            call(inp, out)

        def check() -> tuple[str, str]:
            try:
                op()
                self._sync()
            except Exception as exc:  # a backend failure becomes data, not a crash
                return "error", f"{type(exc).__name__}: {exc}"
            wrong = mismatch(out, expected)
            return ("wrong", wrong) if wrong else ("ok", "")

        failure = self._agree_outcome(point, nbytes, check())
        if failure:
            return failure

        def clear() -> None:
            out.zero_()
            self._sync()

        try:
            samples = self._sample(op, point.mode, clear)
            self._sync()
        except Exception as exc:
            failure = PointRecord(*point.key, nbytes=nbytes, world_size=ctx.world_size, status="error",
                                  error=f"rank {ctx.rank}: {type(exc).__name__}: {exc}")
            return distributed.gather_objects(failure, ctx.cpu_group)[0]
        # The timed calls themselves (replays, in graph mode) must have produced the right result.
        wrong = mismatch(out, expected)
        failure = self._agree_outcome(point, nbytes, ("wrong", f"after timing: {wrong}") if wrong else ("ok", ""))
        if failure:
            return failure
        return PointRecord(*point.key, nbytes=nbytes, world_size=ctx.world_size, status="ok", samples_us=tuple(samples))

    def _sample(self, op, mode: str, clear) -> list[float]:
        """Warm up, estimate, then time; `clear` runs just before the timed loop so its output can be checked."""
        ctx, config = self.ctx, self.config
        timer = make_timer(ctx.device, mode)
        for _ in range(config.warmup_iters):
            op()
        self._sync()
        timer.prepare(op)
        estimate = []
        for _ in range(ESTIMATE_CALLS):
            dist.barrier(group=ctx.cpu_group)
            estimate.append(timer.time_once(op))
        per_call_s = distributed.all_max(sorted(estimate)[ESTIMATE_CALLS // 2], ctx.cpu_group) * 1e-6
        barrier_s = 50e-6  # rough cost of the per-iteration barrier, so tiny ops do not overrun the budget
        iters = int(config.point_budget_s / (per_call_s + barrier_s))
        iters = max(config.min_iters, min(config.max_iters, iters))
        clear()
        samples = []
        for _ in range(iters):
            dist.barrier(group=ctx.cpu_group)
            samples.append(timer.time_once(op))
        return distributed.max_per_iteration(samples, ctx.cpu_group)


def _progress(enabled: bool, total: int):
    """A progress bar on rank 0 only; other ranks get a stand-in."""
    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.description}"))


def run(config: SweepConfig, run_id: str | None = None, resume: str | None = None, progress: bool = True) -> Path:
    """Sweep under torchrun; returns the run directory (rank 0 writes it, all ranks return its path)."""
    ctx = distributed.init(config.timeout_s, config.backend_options)
    try:
        return _run(config, ctx, run_id, resume, progress)
    finally:
        distributed.shutdown()


def _open_writer(config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, baseline: str) -> RunWriter:
    if resume:
        return RunWriter.resume(resume)
    hosts = [distributed.describe_host(ctx)]  # rank 0's; every rank's is added once backends are open
    meta = RunMeta(
        run_id=run_id or new_run_id(ctx.world_size, ctx.device.type), world_size=ctx.world_size,
        device_type=ctx.device.type, config=config.to_dict(), baseline=baseline, started=_now(),
        arxtune_version=__version__, torch_version=torch.__version__,
        nccl_version=".".join(map(str, torch.cuda.nccl.version())) if ctx.device.type == "cuda" else None,
        hostnames=[h["hostname"] for h in hosts], device_names=[h["device"] for h in hosts],
        driver_version=hosts[0]["driver"], rdma_devices=hosts[0]["rdma_devices"], command=shlex.join(sys.argv))
    return RunWriter.create(config.out, meta)


def _run(config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, progress: bool) -> Path:
    writer, error = None, ""
    baseline = config.baseline or default_baseline(ctx.device)
    if ctx.rank == 0:
        try:
            writer = _open_writer(config, ctx, run_id, resume, baseline)
        except ArxtuneError as exc:
            error = str(exc)
    # Rank 0's verdict and the run's own config (on resume) reach every rank, so all stop or go together.
    shared = (error, from_mapping(writer.meta.config) if writer else config, set(writer.done) if writer else set(), str(writer.path) if writer else "")
    error, config, done, path = distributed.gather_objects(shared, ctx.cpu_group)[0]
    if error:
        raise ArxtuneError(error)
    ready, status = open_backends(config.backends, ctx)
    hosts = distributed.gather_objects(distributed.describe_host(ctx), ctx.cpu_group)
    try:
        if writer:
            writer.meta.fabric_floor_us = fabric_floor_us(ready)
            writer.meta.backends = status
            writer.meta.hostnames = [h["hostname"] for h in hosts]
            writer.meta.device_names = [h["device"] for h in hosts]
            writer.write_meta()
        points = [p for p in plan_points(config, ready, ctx.device) if p.key not in done]
        runner = PointRunner(config, ctx)
        with _progress(writer is not None and progress, len(points)) as bar:
            task = bar.add_task("", total=len(points)) if bar else None
            for point in points:
                if bar:
                    bar.update(task, description=f"{point.backend} {point.op} {point.dtype} {format_bytes(point.size)} {point.mode}")
                record = runner.measure(point, ready[point.backend])
                if writer:
                    writer.append(record)
                if bar:
                    bar.advance(task)
        if writer:
            writer.meta.finished = _now()
            writer.write_meta()
        return Path(path)
    finally:
        for backend in ready.values():
            backend.close()
        if writer:
            writer.close()
