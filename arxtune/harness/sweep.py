"""The harness: every rank runs this under torchrun; only rank 0 writes.

Per point (op, dtype, view, size) every backend is checked against an exact
reference and warmed up, its iteration count chosen from a short estimate so
sampling fits the point's budget; then the backends are timed in interleaved
rounds, each sample with all ranks released together by a barrier, keeping
the slowest rank's time per sample.
"""

from __future__ import annotations

import functools
import itertools
import logging
import platform
import secrets
import shlex
import sys
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
import torch.distributed as dist

from arxtune import __version__
from arxtune.runtime import distributed
from arxtune.runtime.backends import OPS, Backend, GroupContext
from arxtune.runtime.backends.startup import default_baseline, open_backends
from arxtune.runtime.ops import DTYPES, OP_SPECS, elements_per_rank, expected_output, make_input, mismatch, size_grid
from arxtune.harness import bitwise
from arxtune.harness.config import SweepConfig, format_bytes, from_mapping
from arxtune.runtime.errors import ArxtuneError
from arxtune.harness.results import PointRecord, RunExists, RunMeta, RunWriter, load_run
from arxtune.harness.launch import JOINED_LINE, RUN_PREFIX, tell_launcher
from arxtune.runtime.decision import DEFAULT_MARGIN, PointTimes, undecided
from arxtune.runtime.timing import Timer, has_timer, make_timer

ESTIMATE_CALLS = 3
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
    def key(self) -> tuple:
        return (self.backend, self.op, self.dtype, self.view, self.size)


def peer_timed_out(exc: BaseException) -> bool:
    """Whether a collective failed because a peer did not answer in time (gloo's and NCCL's timeout errors)."""
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("timeout" in text or "timed out" in text)


def new_run_id(world_size: int, device_type: str) -> str:
    """Time to the microsecond plus a random tag: two sweeps started together never pick the same id."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    return f"{stamp}-{platform.node() or 'host'}-w{world_size}-{device_type}-{secrets.token_hex(2)}"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def fabric_floor_us(ready: dict[str, Backend]) -> float | None:
    """ib_write_lat's 2-byte latency on the fabric, the floor every RDMA backend is plotted against.

    Only where a backend that writes over RDMA runs (one with `fabric_devices()`); None (and the sweep
    goes on) when perftest cannot measure it.
    """
    rdma = next((backend for backend in ready.values() if callable(getattr(backend, "fabric_devices", None))), None)
    if rdma is None:
        return None
    from arxtune.runtime.rdma.floor import measure_write_latency_us

    devices = rdma.fabric_devices()
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
            names = tuple(name for name, backend in ready.items() if op in getattr(backend, "ops", OPS)
                          and (view != "graph" or backend.capturable))
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


def rotating_op(bind: Callable[[torch.Tensor, torch.Tensor], Callable[[], None]], ins: list[torch.Tensor],
                outs: list[torch.Tensor]) -> Callable[[], None]:
    """A zero-argument op that runs on the next (input, output) pair each time."""
    calls = [bind(i, o) for i, o in zip(ins, outs)]
    if len(calls) == 1:
        return calls[0]
    following = itertools.cycle(calls).__next__
    return lambda: following()()


@dataclass
class _Timed:
    """One backend's state while its point is timed in rounds."""

    point: Point
    nbytes: int
    op: Callable[[], None]
    outs: list[torch.Tensor]  # the output buffers the calls rotate through (buffer_count)
    expected: torch.Tensor
    timer: Timer
    #: The inputs: held here, since a backend's bound call may keep only their addresses.
    ins: list[torch.Tensor] = field(default_factory=list)
    #: The backend's check for failures its calls could not raise (inside a graph replay), if it has one.
    check: Callable[[], None] | None = None
    iters_per_round: int = 0
    samples: list[float] = field(default_factory=list)
    round_iters: list[int] = field(default_factory=list)


def _times(timed: _Timed) -> PointTimes:
    """The decision rule's view of one backend's rounds so far."""
    rounds, start = [], 0
    for n in timed.round_iters:
        rounds.append(timed.samples[start:start + n])
        start += n
    return PointTimes.from_rounds(rounds)


class PointRunner:
    """Measures one group of backends at one point on every rank; returns the same records everywhere.

    Each backend is checked and warmed up, then all are timed in `rounds`
    rounds; within a round the backends take turns, in reversed order every
    other round, so slow drift (other load, clocks) falls on all of them alike.
    Where the baseline and a challenger are then close, up to
    `max_extra_rounds` more rounds follow, until the rule's answer is settled.
    """

    def __init__(self, config: SweepConfig, ctx: GroupContext):
        self.config = config
        self.ctx = ctx
        self.baseline = config.baseline or default_baseline(ctx.device)

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

    def _guard(self, point: Point, nbytes: int, work: Callable[[], None], check: Callable[[], None] | None = None) -> PointRecord | None:
        """Run `work` on every rank; any rank's exception, or one its backend's `check` raises after
        synchronising, becomes the same error record everywhere."""
        try:
            work()
            self._sync()
            if check is not None:
                check()
            local = ("ok", "")
        except Exception as exc:  # a backend failure becomes data, not a crash
            if peer_timed_out(exc):
                raise  # a rank that does not answer: the sweep ends now, not after another timeout agreeing on it
            local = ("error", f"{type(exc).__name__}: {exc}")
        return self._agree_outcome(point, nbytes, local)

    def _prepare(self, point: Point, backend: Backend) -> _Timed | PointRecord:
        """Check the result, warm up and size the rounds; a failure record if the backend cannot be timed here."""
        ctx, config = self.ctx, self.config
        dtype = DTYPES[point.dtype]
        spec = OP_SPECS[point.op]
        n = elements_per_rank(point.op, point.size, ctx.world_size, dtype.itemsize)
        nbytes = spec.nbytes(n, ctx.world_size, dtype.itemsize)
        if not distributed.all_true(backend.supports(point.op, dtype, nbytes), ctx.cpu_group):
            return PointRecord(*point.key, nbytes=nbytes, world_size=ctx.world_size, status="unsupported",
                               error=f"{point.backend} does not support {point.op} {point.dtype} at {nbytes} bytes")
        timer = make_timer(ctx.device, point.view, nbytes, config.decode_busy_us)
        count = buffer_count(timer, nbytes, config.max_bytes)
        ins = [make_input(point.op, n, ctx.rank, ctx.world_size, dtype, ctx.device) for _ in range(count)]
        outs = [torch.zeros(spec.shapes(n, ctx.world_size)[1], dtype=dtype, device=ctx.device) for _ in range(count)]
        timed = _Timed(point, nbytes, timed_op(backend, point.op, ins, outs), outs,
                       expected_output(point.op, n, ctx.rank, ctx.world_size, dtype), timer, ins=ins,
                       check=getattr(backend, "check", None))
        failure = self._guard(point, nbytes, timed.op, timed.check)
        if failure:
            return failure
        wrong = mismatch(outs[0], timed.expected)  # the first call wrote the first buffer
        failure = self._agree_outcome(point, nbytes, ("wrong", wrong) if wrong else ("ok", ""))
        if failure:
            return failure
        estimate: list[float] = []  # wall seconds per sample, its barrier included

        def warm_up() -> None:
            for _ in range(config.warmup_iters):
                timed.op()
            self._sync()
            timed.timer.prepare(timed.op)
            for _ in range(ESTIMATE_CALLS):
                start = time.perf_counter()
                dist.barrier(group=ctx.cpu_group)
                timed.timer.time_once(timed.op)
                estimate.append(time.perf_counter() - start)

        failure = self._guard(point, nbytes, warm_up, timed.check)
        if failure:
            return failure
        per_sample_s = distributed.all_max(sorted(estimate)[ESTIMATE_CALLS // 2], ctx.cpu_group)
        iters = max(config.min_iters, min(config.max_iters, int(config.point_budget_s / per_sample_s)))
        timed.iters_per_round = max(MIN_ITERS_PER_ROUND, -(-iters // config.rounds))
        for out in timed.outs:
            out.zero_()  # the timed calls must write the result again: checked after the last round
        self._sync()
        return timed

    def _round(self, timed: _Timed) -> PointRecord | None:
        """One round of one backend: barrier-aligned samples, slowest rank per sample."""
        ctx = self.ctx
        local: list[float] = []

        def sample() -> None:
            for _ in range(timed.iters_per_round):
                dist.barrier(group=ctx.cpu_group)
                local.append(timed.timer.time_once(timed.op))

        failure = self._guard(timed.point, timed.nbytes, sample, timed.check)
        if failure:
            return failure
        timed.samples.extend(distributed.max_per_iteration(local, ctx.cpu_group))
        timed.round_iters.append(len(local))
        return None

    def _finish(self, timed: _Timed) -> PointRecord:
        wrong = next(filter(None, (mismatch(out, timed.expected) for out in timed.outs)), None)
        failure = self._agree_outcome(timed.point, timed.nbytes, ("wrong", f"after timing: {wrong}") if wrong else ("ok", ""))
        if failure:
            return failure
        return PointRecord(*timed.point.key, nbytes=timed.nbytes, world_size=self.ctx.world_size, status="ok",
                           samples_us=tuple(timed.samples), round_iters=tuple(timed.round_iters))

    def _close(self, active: list[_Timed], records: dict[str, PointRecord]) -> bool:
        """Whether the baseline and a challenger are still close (another round could change the
        decision rule's answer); the same on every rank, since every rank holds the same samples."""
        timed = {t.point.backend: t for t in active if t.point.backend not in records and t.samples}
        base = timed.get(self.baseline)
        if base is None:
            return False
        base_times = _times(base)
        return any(undecided(_times(t), base_times, DEFAULT_MARGIN) for name, t in timed.items() if name != self.baseline)

    def measure_group(self, group: PointGroup, ready: dict[str, Backend]) -> list[PointRecord]:
        records: dict[str, PointRecord] = {}
        active: list[_Timed] = []
        for point in group.points():
            prepared = self._prepare(point, ready[point.backend])
            if isinstance(prepared, PointRecord):
                records[point.backend] = prepared
            else:
                active.append(prepared)
        round_no = 0
        while round_no < self.config.rounds or (round_no < self.config.rounds + self.config.max_extra_rounds
                                                and self._close(active, records)):
            for timed in (active if round_no % 2 == 0 else active[::-1]):
                if timed.point.backend not in records:
                    failure = self._round(timed)
                    if failure:
                        records[timed.point.backend] = failure
            round_no += 1
        for timed in active:
            if timed.point.backend not in records:
                records[timed.point.backend] = self._finish(timed)
        self._bitwise(group, ready, records)
        return [records[name] for name in group.backends]

    def _bitwise(self, group: PointGroup, ready: dict[str, Backend], records: dict[str, PointRecord]) -> None:
        """Each passing backend once more on data that rounds: whether it gives the baseline's bits (harness/bitwise.py)."""
        def call(name: str, inp: torch.Tensor, out: torch.Tensor) -> str:
            backend = ready[name]
            try:
                bound_call(backend, group.op)(inp, out)()
                self._sync()
                if (check := getattr(backend, "check", None)) is not None:
                    check()
            except Exception as exc:  # as in _guard: a failure becomes data, a silent peer ends the sweep
                if peer_timed_out(exc):
                    raise
                return f"{type(exc).__name__}: {exc}"
            return ""

        passed = [name for name in group.backends if records[name].status == "ok"]
        for name, found in bitwise.check(group.op, group.dtype, group.size, self.ctx, self.baseline, passed, call).items():
            records[name] = (replace(records[name], bitwise=found) if isinstance(found, bool) else
                             replace(records[name], status="error", samples_us=(), round_iters=(), error=f"bitwise check: {found}"))


def _progress(enabled: bool, total: int):
    """A progress bar on rank 0 only; other ranks get a stand-in."""
    if not enabled:
        return nullcontext(None)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    return Progress(TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), TextColumn("{task.description}"))


def run(config: SweepConfig, run_id: str | None = None, resume: str | None = None, progress: bool = True) -> Path:
    """Sweep under torchrun; returns the run directory (rank 0 writes it, all ranks return its path)."""
    ctx = distributed.init(config.timeout_s, config.backend_options)
    tell_launcher(JOINED_LINE)  # the launcher's sign that the rendezvous is over
    finished = False
    try:
        path = _run(config, ctx, run_id, resume, progress)
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
        run_id=run_id, world_size=ctx.world_size,
        device_type=ctx.device.type, config=config.to_dict(), baseline=baseline, started=_now(),
        arxtune_version=__version__, torch_version=torch.__version__,
        nccl_version=".".join(map(str, torch.cuda.nccl.version())) if ctx.device.type == "cuda" else None,
        hostnames=[h["hostname"] for h in hosts], device_names=[h["device"] for h in hosts],
        driver_version=hosts[0]["driver"], rdma_devices=hosts[0]["rdma_devices"], command=shlex.join(sys.argv))


def _reopen(resume: str, ctx: GroupContext, hosts: list[dict]) -> RunWriter:
    """Continue a run only where it was measured: same world size, hosts and devices."""
    meta = load_run(resume).meta
    here = ([h["hostname"] for h in hosts], [h["device"] for h in hosts])
    if meta.world_size != ctx.world_size or (meta.hostnames, meta.device_names) != here:
        raise ArxtuneError(f"run {resume} was measured with {meta.world_size} ranks on {meta.hostnames} ({meta.device_names}); "
                           f"this job is {ctx.world_size} ranks on {here[0]} ({here[1]}): resume it there, or start a new sweep")
    try:
        from_mapping(meta.config)
    except ArxtuneError as exc:
        raise ArxtuneError(f"run {resume} has a config this arxtune cannot use ({exc}); start a new sweep") from None
    return RunWriter.resume(resume)


def _open_writer(config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, baseline: str,
                 hosts: list[dict]) -> RunWriter:
    if resume:
        return _reopen(resume, ctx, hosts)
    for _ in range(3):
        try:
            return RunWriter.create(config.out, _new_meta(config, ctx, run_id or new_run_id(ctx.world_size, ctx.device.type), baseline, hosts))
        except RunExists:
            if run_id:
                raise
    raise ArxtuneError(f"could not pick a fresh run id in {config.out}; pass --run-id NAME")


def _prepare(config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, baseline: str,
             hosts: list[dict]) -> tuple[RunWriter | None, tuple]:
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


def _run(config: SweepConfig, ctx: GroupContext, run_id: str | None, resume: str | None, progress: bool) -> Path:
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
        if writer:
            writer.meta.finished = _now()
            writer.write_meta()
        return Path(path)
    finally:
        for backend in ready.values():
            backend.close()
        if writer:
            writer.close()
