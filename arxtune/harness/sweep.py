"""The harness: every rank runs this under torchrun; only rank 0 writes.

Per point (op, dtype, view, size) the backends are measured by the engine in
arxtune.runtime.rounds (exact first call, warm-up, interleaved rounds of
barrier-aligned samples, the slowest rank's each, the check after timing);
the sweep gives it its budget: samples sized to fit `point_budget_s`, `rounds`
rounds and up to `max_extra_rounds` more where the baseline is still close to
a challenger.
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import platform
import secrets
import shlex
import socket
import sys
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch

from arxtune import __version__
from arxtune.harness import distributed
from arxtune.runtime.backends import OPS, Backend, GroupContext
from arxtune.runtime.backends.startup import default_baseline, open_backends
from arxtune.runtime.ops import DTYPES, OP_SPECS, elements_per_rank, expected_output, make_input, size_grid
from arxtune.harness import bitwise
from arxtune.harness.config import SweepConfig, format_bytes, from_mapping
from arxtune.runtime.errors import ArxtuneError
from arxtune.harness.results import PointRecord, RunExists, RunMeta, RunWriter, load_run
from arxtune.harness.launch import JOINED_LINE, RUN_PREFIX, tell_launcher
from arxtune.harness.nccl_facts import LogCapture
from arxtune.runtime.faster import DEFAULT_MARGIN
from arxtune.runtime.fingerprint import nccl_version
from arxtune.runtime.rounds import ESTIMATE_SAMPLES, Entry, Plan, Rounds
from arxtune.runtime.runs import now
from arxtune.runtime.timing import Timer, has_timer, make_timer

#: Fewest samples a backend contributes to one round.
MIN_ITERS_PER_ROUND = 3
log = logging.getLogger("arxtune")


@dataclass(frozen=True)
class Point:
    backend: str
    op: str
    dtype: str
    view: str
    size: int

    @property
    def key(self) -> tuple[str, str, str, str, int]:
        return (self.backend, self.op, self.dtype, self.view, self.size)


def peer_timed_out(exc: BaseException) -> bool:
    """Whether a collective failed because a peer did not answer in time (gloo's and NCCL's timeout errors)."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("timeout" in text or "timed out" in text)


def new_run_id(world_size: int, device_type: str) -> str:
    """Time to the microsecond plus a random tag: two sweeps started together never pick the same id."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    return f"{stamp}-{platform.node() or 'host'}-w{world_size}-{device_type}-{secrets.token_hex(2)}"


def fabric_floor_us(ready: dict[str, Backend]) -> float | None:
    """ib_write_lat's 2-byte latency on the fabric, the floor every RDMA backend is plotted against.

    Only where a backend that writes over RDMA runs (one with `fabric_devices()`); None (and the sweep
    goes on) when perftest cannot measure it.
    """
    fabric_devices = next((f for backend in ready.values() if callable(f := getattr(backend, "fabric_devices", None))), None)
    if fabric_devices is None:
        return None
    from arxtune.runtime.rdma.floor import measure_write_latency_us

    devices = fabric_devices()
    try:
        return measure_write_latency_us(devices[0] if devices else None, timeout_s=60)
    except ArxtuneError as exc:
        log.warning("arxtune: no fabric floor: %s", exc)
        return None


@dataclass(frozen=True)
class PointGroup:
    """The backends timed together at one (op, dtype, view, size): the unit of rounds and of resume."""

    op: str
    dtype: str
    view: str
    size: int
    backends: tuple[str, ...]

    def points(self) -> list[Point]:
        return [Point(name, self.op, self.dtype, self.view, self.size) for name in self.backends]


def plan_points(config: SweepConfig, ready: dict[str, Backend], device: torch.device) -> list[PointGroup]:
    """One group per (view, op, dtype, size), holding every ready backend that can run it."""
    sizes = size_grid(config.min_bytes, config.max_bytes, config.step_factor)
    groups = []
    for view in config.views:
        if not has_timer(device, view):
            continue
        for op in config.ops:
            names = tuple(
                name for name, backend in ready.items() if op in getattr(backend, "ops", OPS) and (view != "graph" or backend.capturable)
            )
            if not names:
                continue
            for dtype in config.dtypes:
                groups.extend(PointGroup(op, dtype, view, size, names) for size in sizes)
    return groups


def buffer_count(timer: Timer, nbytes: int, span_bytes: int) -> int:
    """How many (input, output) pairs the calls of one sample rotate through: nccl-tests shifts its
    buffers by the message size at every call of a run, within the sweep's largest size, so a call
    does not find the previous calls' data in cache. One where a sample is one call (every buffer
    is written in every sample, so the check after timing sees what the timed calls wrote)."""
    return max(1, min(timer.ops_per_sample, span_bytes // max(nbytes, 1)))


def bound_call(backend: Backend, op: str) -> Callable[[torch.Tensor, torch.Tensor], Callable[[], None]]:
    """(input, output) -> a zero-argument call of `op`: the backend's own `bind` where it has one
    (work it can do once per buffer pair stays out of the timed calls), else a plain closure."""
    bind = getattr(backend, "bind", None)
    if bind is not None:
        return functools.partial(bind, op)
    call = getattr(backend, op)
    return lambda inp, out: lambda: call(inp, out)


def timed_op(backend: Backend, op: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> Callable[[], None]:
    """The op a timer runs, rotating through the buffer pairs: the backend's own `bind_rotation`
    where it has one (its result may offer `repeat(n)`, n calls launched back to back by the
    backend itself), else `rotating_op` over its bound calls."""
    own = getattr(backend, "bind_rotation", None)
    return own(op, ins, outs) if own is not None else rotating_op(bound_call(backend, op), ins, outs)


def rotating_op(
    bind: Callable[[torch.Tensor, torch.Tensor], Callable[[], None]], ins: list[torch.Tensor], outs: list[torch.Tensor]
) -> Callable[[], None]:
    """A zero-argument op that runs on the next (input, output) pair each time."""
    calls = [bind(i, o) for i, o in zip(ins, outs)]
    if len(calls) == 1:
        return calls[0]
    following = itertools.cycle(calls).__next__
    return lambda: following()()


@dataclass(frozen=True)
class SweepBudget:
    """The sweep's budget for one point: `rounds` rounds of samples sized to fit `point_budget_s`
    (within min_iters..max_iters), up to `max_extra_rounds` more while the baseline and a challenger are close."""

    config: SweepConfig
    estimate_samples = ESTIMATE_SAMPLES

    @property
    def warmup_calls(self) -> int:
        return self.config.warmup_iters

    def plan(self, per_sample_s: dict[str, float]) -> Plan:
        config, per_round = self.config, {}
        for name, seconds in per_sample_s.items():
            iters = max(config.min_iters, min(config.max_iters, int(config.point_budget_s / max(seconds, 1e-9))))
            per_round[name] = max(MIN_ITERS_PER_ROUND, -(-iters // config.rounds))
        return Plan(config.rounds, per_round)

    def another(self, done: int, plan: Plan, close: Callable[[], bool]) -> bool:
        return done < plan.rounds or (done < plan.rounds + self.config.max_extra_rounds and close())


class PointRunner:
    """Measures one group of backends at one point on every rank (runtime.rounds within the sweep's budget);
    returns the same records everywhere."""

    def __init__(self, config: SweepConfig, ctx: GroupContext):
        self.config = config
        self.ctx = ctx
        self.baseline = config.baseline or default_baseline(ctx.device)
        self.engine = Rounds(ctx, DEFAULT_MARGIN, fatal=peer_timed_out)  # a silent peer ends the sweep, not the point

    def _entry(self, point: Point, backend: Backend, n: int) -> Entry:
        ctx, dtype = self.ctx, DTYPES[point.dtype]
        nbytes = OP_SPECS[point.op].nbytes(n, ctx.world_size, dtype.itemsize)
        timer = make_timer(ctx.device, point.view, nbytes, self.config.decode_busy_us)
        count = buffer_count(timer, nbytes, self.config.max_bytes)
        ins = [make_input(point.op, n, ctx.rank, ctx.world_size, dtype, ctx.device) for _ in range(count)]
        outs = [torch.zeros(OP_SPECS[point.op].shapes(n, ctx.world_size)[1], dtype=dtype, device=ctx.device) for _ in range(count)]
        return Entry(
            point.backend,
            timed_op(backend, point.op, ins, outs),
            outs,
            expected_output(point.op, n, ctx.rank, ctx.world_size, dtype),
            lambda first_s: timer,
            getattr(backend, "check", None),
            tuple(ins),
        )

    def measure_group(self, group: PointGroup, ready: dict[str, Backend]) -> list[PointRecord]:
        ctx, dtype = self.ctx, DTYPES[group.dtype]
        n = elements_per_rank(group.op, group.size, ctx.world_size, dtype.itemsize)
        nbytes = OP_SPECS[group.op].nbytes(n, ctx.world_size, dtype.itemsize)
        records: dict[str, PointRecord] = {}
        entries = []
        for point in group.points():
            if distributed.all_true(ready[point.backend].supports(point.op, dtype, nbytes), ctx.cpu_group):
                entries.append(self._entry(point, ready[point.backend], n))
            else:
                records[point.backend] = PointRecord(
                    *point.key,
                    nbytes=nbytes,
                    world_size=ctx.world_size,
                    status="unsupported",
                    error=f"{point.backend} does not support {point.op} {point.dtype} at {nbytes} bytes",
                )
        for name, got in self.engine.measure(entries, SweepBudget(self.config), self.baseline).items():
            records[name] = PointRecord(
                name,
                group.op,
                group.dtype,
                group.view,
                group.size,
                nbytes=nbytes,
                world_size=ctx.world_size,
                status=got.status,
                samples_us=tuple(s for r in got.rounds for s in r),
                error=got.error,
                round_iters=tuple(len(r) for r in got.rounds),
            )
        self._bitwise(group, ready, records)
        return [records[name] for name in group.backends]

    def _bitwise(self, group: PointGroup, ready: dict[str, Backend], records: dict[str, PointRecord]) -> None:
        """Each passing backend once more on data that rounds: whether it gives the baseline's bits (harness/bitwise.py)."""

        def call(name: str, inp: torch.Tensor, out: torch.Tensor) -> str:
            backend = ready[name]
            try:
                bound_call(backend, group.op)(inp, out)()
                self.engine.sync()
                if (check := getattr(backend, "check", None)) is not None:
                    check()
            except Exception as exc:  # as in _guard: a failure becomes data, a silent peer ends the sweep
                if peer_timed_out(exc):
                    raise
                return f"{type(exc).__name__}: {exc}"
            return ""

        passed = [name for name in group.backends if records[name].status == "ok"]
        for name, found in bitwise.check(group.op, group.dtype, group.size, self.ctx, self.baseline, passed, call).items():
            records[name] = (
                replace(records[name], bitwise=found)
                if isinstance(found, bool)
                else replace(records[name], status="error", samples_us=(), round_iters=(), error=f"bitwise check: {found}")
            )


def _progress(enabled: bool, total: int):
    """A progress bar on rank 0 only; other ranks get a stand-in."""
    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.description}"))


def _capture_nccl_log() -> LogCapture | None:
    """Where a GPU rank's NCCL writes its set-up (the transport, HCAs, GID and channels it used); set before
    NCCL starts in this process. None on CPU: no NCCL runs there."""
    from arxtune.harness.launch import local_device_type

    if local_device_type() != "cuda":
        return None
    capture = LogCapture.plan(os.environ, tempfile.gettempdir())
    os.environ.update(capture.settings)
    return capture


def pair_settings_for(config: SweepConfig, host=None) -> dict[str, str]:
    """With `nccl_pair_settings`, this rank's NCCL_IB_HCA, NCCL_IB_GID_INDEX and NCCL_SOCKET_IFNAME where unset
    (derived as `arxtune doctor` derives them); set before NCCL starts in this process."""
    if not config.nccl_pair_settings:
        return {}
    from arxtune.harness.doctor import Host, endpoints
    from arxtune.harness.nccl_facts import pair_settings

    usable = endpoints(host or Host())
    named = config.backend_options.get("arx", {}).get("devices")
    if named:
        usable = sorted((e for e in usable if e.device in named), key=lambda e: list(named).index(e.device))
    applied = {k: v for k, v in pair_settings(usable).values.items() if not os.environ.get(k)}
    os.environ.update(applied)
    return applied


def run(config: SweepConfig, run_id: str | None = None, resume: str | None = None, progress: bool = True) -> Path:
    """Sweep under torchrun; returns the run directory (rank 0 writes it, all ranks return its path)."""
    pair_settings_for(config)
    nccl_log = _capture_nccl_log()
    ctx = distributed.init(config.timeout_s, config.backend_options)
    tell_launcher(JOINED_LINE)  # the launcher's sign that the rendezvous is over
    finished = False
    try:
        path = _run(config, ctx, run_id, resume, progress, nccl_log)
        finished = True
        return path
    except RuntimeError as exc:
        if peer_timed_out(exc):
            raise ArxtuneError(f"a rank did not answer within timeout_s ({config.timeout_s:g} s): {' '.join(str(exc).split())}") from None
        raise
    finally:
        # Only a finished run leaves together: after an interrupt, an error or a silent peer, a barrier would wait out the timeout.
        distributed.shutdown(together=finished)


def _new_meta(config: SweepConfig, ctx: GroupContext, run_id: str, baseline: str, hosts: list[dict]) -> RunMeta:
    return RunMeta(
        run_id=run_id,
        world_size=ctx.world_size,
        device_type=ctx.device.type,
        config=config.to_dict(),
        baseline=baseline,
        started=now(),
        arxtune_version=__version__,
        torch_version=torch.__version__,
        nccl_version=nccl_version(ctx.device),
        hostnames=[h["hostname"] for h in hosts],
        device_names=[h["device"] for h in hosts],
        driver_version=hosts[0]["driver"],
        rdma_devices=hosts[0]["rdma_devices"],
        command=shlex.join(sys.argv),
    )


def _reopen(resume: str, ctx: GroupContext, hosts: list[dict]) -> RunWriter:
    """Continue a run only where it was measured: same world size, hosts and devices."""
    meta = load_run(resume).meta
    here = ([h["hostname"] for h in hosts], [h["device"] for h in hosts])
    if meta.world_size != ctx.world_size or (meta.hostnames, meta.device_names) != here:
        raise ArxtuneError(
            f"run {resume} was measured with {meta.world_size} ranks on {meta.hostnames} ({meta.device_names}); "
            f"this job is {ctx.world_size} ranks on {here[0]} ({here[1]}): resume it there, or start a new sweep"
        )
    try:
        from_mapping(meta.config)
    except ArxtuneError as exc:
        raise ArxtuneError(f"run {resume} has a config this arxtune cannot use ({exc}); start a new sweep") from None
    return RunWriter.resume(resume)


def _open_writer(
    config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, baseline: str, hosts: list[dict]
) -> RunWriter:
    if resume:
        return _reopen(resume, ctx, hosts)
    for _ in range(3):
        try:
            return RunWriter.create(
                config.out, _new_meta(config, ctx, run_id or new_run_id(ctx.world_size, ctx.device.type), baseline, hosts)
            )
        except RunExists:
            if run_id:
                raise
    raise ArxtuneError(f"could not pick a fresh run id in {config.out}; pass --run-id NAME")


def _prepare(
    config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, baseline: str, hosts: list[dict]
) -> tuple[RunWriter | None, tuple]:
    """Rank 0 opens the run; (writer, verdict shared with every rank). Any failure becomes the verdict's error line."""
    if ctx.rank != 0:
        return None, ("", None, set(), "")
    try:
        writer = _open_writer(config, ctx, run_id, resume, baseline, hosts)
        tell_launcher(f"{RUN_PREFIX}{writer.path}")
        return writer, ("", from_mapping(writer.meta.config), set(writer.done), str(writer.path))
    except ArxtuneError as exc:
        return None, (str(exc), None, set(), "")
    except Exception as exc:  # never leave the other ranks waiting on a verdict that will not come
        return None, (f"cannot start the run ({type(exc).__name__}: {exc})", None, set(), "")


def _nccl_used(ctx: GroupContext, capture: LogCapture | None) -> list[dict] | None:
    """Every rank's record of what NCCL used (gathered on every rank; rank 0 stores it); None on CPU."""
    if ctx.device.type != "cuda":
        return None
    mine = capture.record(socket.gethostname(), os.getpid(), ctx.rank) if capture else {"rank": ctx.rank, "error": "no capture"}
    return distributed.gather_objects(mine, ctx.cpu_group)


def _run(
    config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, progress: bool, nccl_log: LogCapture | None = None
) -> Path:
    baseline = config.baseline or default_baseline(ctx.device)
    hosts = distributed.gather_objects(distributed.describe_host(ctx), ctx.cpu_group)
    writer, verdict = _prepare(config, ctx, run_id, resume, baseline, hosts)
    # Rank 0's verdict and the run's own config (on resume) reach every rank, so all stop or go together.
    error, run_config, done, path = distributed.gather_objects(verdict, ctx.cpu_group)[0]
    if error:
        raise ArxtuneError(error)
    config = run_config
    ready, status = open_backends(config.timed_backends(), ctx)
    try:
        if writer:
            writer.meta.fabric_floor_us = fabric_floor_us(ready)
            writer.meta.backends = status
            writer.write_meta()
        # A group is done once every backend's record is there; a group cut short is timed again in full.
        groups = [g for g in plan_points(config, ready, ctx.device) if not all(p.key in done for p in g.points())]
        runner = PointRunner(config, ctx)
        with _progress(writer is not None and progress, len(groups)) as bar:
            task = bar.add_task("", total=len(groups)) if bar else None
            for group in groups:
                if bar:
                    bar.update(task, description=f"{group.op} {group.dtype} {format_bytes(group.size)} {group.view}")
                records = runner.measure_group(group, ready)
                if writer:
                    writer.append_group([r for r in records if r.key not in done])
                if bar:
                    bar.advance(task)
        nccl_used = _nccl_used(ctx, nccl_log)
        if writer:
            writer.meta.nccl_used = nccl_used
            writer.meta.finished = now()
            writer.write_meta()
        if nccl_log and nccl_log.settings:  # our own log, read: nothing in it the run does not hold
            nccl_log.path(socket.gethostname(), os.getpid()).unlink(missing_ok=True)
        return Path(path)
    finally:
        for backend in ready.values():
            backend.close()
        if writer:
            writer.close()
