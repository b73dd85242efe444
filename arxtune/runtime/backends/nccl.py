"""NCCL called directly (ctypes), out of place: the figures nccl-tests prints.

torch.distributed's NCCL path costs ~28 us of host work per call on an H200
host (Work objects, events, the watchdog), so back-to-back eager calls measure
c10d rather than NCCL, and its all_reduce is in place (a copy first). This
backend binds the libnccl that torch already loaded, makes its own communicator
(the unique id travels over the run's gloo group) and launches each op with
nothing in between: what a C caller, vLLM's PyNccl or nccl-tests sees.
`torch_nccl` (torch_dist.py) keeps the c10d path for those who call it.

Eager samples launch their calls from a small C loop (nccl_burst.c), as
nccl-tests does: below a few MiB a call is bound by the host, and a Python
call adds about a microsecond to NCCL's own enqueue. The loop also records the
sample's two events (cuEventRecord), so the interval holds the launches and not
the calls into and out of Python around them. Where the loop cannot be built
(no C compiler), or with ARXTUNE_NCCL_LOOP=python, they launch from Python; the
run's backend options say which (`eager_loop`, `eager_events`).

Variants (`nccl[proto=LL]`, `nccl[algo=Ring,channels=4]`; nccl_variant.py)
are communicators of their own, created with that protocol, algorithm or
channel count: NCCL then uses it for every call, so the sweep times NCCL as a
tuner plugin would have it at each size. A setting NCCL refuses at creation
is the variant's availability reason.
"""

from __future__ import annotations

import ctypes
import functools
import itertools
import sys
from pathlib import Path
from typing import ClassVar

import torch
import torch.distributed as dist

from arxtune.runtime import native
from arxtune.runtime.group import gather_objects
from arxtune.runtime.backends.base import BackendUnavailable
from arxtune.runtime.group import GroupContext
from arxtune.runtime.backends.nccl_lib import DTYPES, SUM, CommConfig, NcclLibrary, UniqueId, nccl_environment
from arxtune.runtime.backends.nccl_variant import NcclVariant
from arxtune.runtime.backends.torch_dist import nccl_missing
from arxtune.runtime import env

ENV_LOOP = env.NCCL_LOOP.name
BURST_SOURCE = Path(__file__).with_name("nccl_burst.c")


@functools.lru_cache(maxsize=1)
def launch_loop() -> tuple[object, str]:
    """(the C loop's entry point or None, where eager calls launch from: "c" or "python (why)")."""
    if env.NCCL_LOOP.get() == "python":
        return None, f"python ({ENV_LOOP}=python)"
    try:
        fn = ctypes.CDLL(str(native.build(BURST_SOURCE))).arxtune_nccl_burst
    except OSError as exc:
        print(f"nccl: the C launch loop is unavailable ({exc}); eager calls launch from Python", file=sys.stderr)
        return None, f"python (no C loop: {exc})"
    vp = ctypes.c_void_p
    fn.restype = ctypes.c_int
    fn.argtypes = [
        vp,
        ctypes.c_int,
        vp,
        vp,
        ctypes.c_int,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        vp,
        vp,
        ctypes.c_int,
        vp,
        vp,
        vp,
        vp,
        vp,
    ]
    return fn, "c"


@functools.lru_cache(maxsize=1)
def event_record() -> tuple[ctypes.c_void_p | None, str]:
    """(the driver's cuEventRecord, which takes torch's events and streams as they are, or None;
    where eager samples record their events: "c" or "python (why)")."""
    try:
        return ctypes.cast(ctypes.CDLL("libcuda.so.1").cuEventRecord, ctypes.c_void_p), "c"
    except (OSError, AttributeError) as exc:
        return None, f"python (no cuEventRecord: {exc})"


class Rotation:
    """Calls of one op rotating through buffer pairs: one from Python per call(), or `repeat(n, start, end)`
    launched back to back from the C loop (pair i % pairs for the i-th), between events `start` and `end`;
    `decode(n, busy, start, end)` puts a busy kernel (cudadrv.BusyKernel) before each call, from C too."""

    def __init__(self, backend: "NcclBackend", op: str, ins: list[torch.Tensor], outs: list[torch.Tensor], loop) -> None:
        self._next = itertools.cycle([backend.bind(op, i, o) for i, o in zip(ins, outs)]).__next__
        fn, (_, _, count, dtype, *reduction, comm) = backend._arguments(op, ins[0], outs[0])
        pairs = len(ins)
        self._head = (
            ctypes.cast(fn, ctypes.c_void_p),
            int(bool(reduction)),
            (ctypes.c_void_p * pairs)(*[t.data_ptr() for t in ins]),
            (ctypes.c_void_p * pairs)(*[t.data_ptr() for t in outs]),
            pairs,
            count,
            dtype,
            reduction[0] if reduction else SUM,
            comm,
        )
        self._loop, self._backend, self._name = loop, backend, f"nccl {op}"
        self.repeat = self._launch_from_c if loop is not None else None  # None: the timer loops over call()
        self.decode = self._decode_from_c if loop is not None else None

    def __call__(self) -> None:
        self._next()()

    def _decode_from_c(self, calls: int, busy, start: torch.cuda.Event | None = None, end: torch.cuda.Event | None = None) -> None:
        """`calls` x (busy kernel, call) from C, between events `start` and `end`."""
        from arxtune.runtime import cudadrv

        before = ctypes.cast(cudadrv.c_entry("arxtune_launch"), ctypes.c_void_p).value
        self._launch_from_c(calls, start, end, (before, busy.launch.address))

    def _launch_from_c(
        self,
        calls: int,
        start: torch.cuda.Event | None = None,
        end: torch.cuda.Event | None = None,
        before: tuple[int, int] | tuple[None, None] = (None, None),
    ) -> None:
        """`calls` launches; with events, `start` and `end` are recorded around them, from C where libcuda allows;
        `before` = (function, argument) runs ahead of each call."""
        b = self._backend
        timed = start is not None and end is not None
        record = event_record()[0] if timed else None
        handles = (None, None)
        if record is not None:
            for event in (start, end):
                if not event.cuda_event:
                    event.record()  # torch creates an event at its first record
            handles = (start.cuda_event, end.cuda_event)  # type: ignore[assignment]
        elif timed:
            start.record()
        rc = self._loop(*self._head, b._stream(b.device_index), calls, record, *handles, *before)
        if timed and record is None:
            end.record()
        if rc < 0:
            raise RuntimeError(f"{self._name}: cuEventRecord or the busy kernel's launch failed: CUDA error {-rc}")
        if rc:
            b.nccl.check(rc, self._name)


class NcclBackend:
    name = "nccl"
    capturable = True

    @classmethod
    def why_not_here(cls) -> str | None:
        return nccl_missing()

    device_type = "cuda"
    ops: ClassVar[tuple[str, ...]] = ("all_reduce", "all_gather", "reduce_scatter")
    #: `nccl[proto=LL,channels=4]`: the registry's variants (backends/__init__.py).
    parse_variant = staticmethod(NcclVariant.parse)

    def __init__(self, ctx: GroupContext, variant: NcclVariant | None = None):
        self.variant = variant or NcclVariant()
        if ctx.device.type != "cuda":
            raise BackendUnavailable(f"nccl runs on CUDA tensors; this run uses {ctx.device.type}")
        if not dist.is_initialized():
            raise BackendUnavailable("torch.distributed is not initialised")
        self.nccl = NcclLibrary()
        uid = UniqueId()
        rank, world = dist.get_rank(ctx.cpu_group), dist.get_world_size(ctx.cpu_group)
        if rank == 0:
            self.nccl.check(self.nccl.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        root_id = gather_objects(bytes(uid.internal), ctx.cpu_group)[0]  # group rank 0's id, whatever the group
        ctypes.memmove(uid.internal, root_id, len(uid.internal))
        self.comm = ctypes.c_void_p()
        with torch.cuda.device(ctx.device):
            self._init_comm(world, uid, rank)
        self.device_index = ctx.device.index if ctx.device.index is not None else torch.cuda.current_device()
        self._stream = torch._C._cuda_getCurrentRawStream  # the raw cudaStream_t of the current (or capturing) stream
        lib = self.nccl.lib
        #: op -> (entry point, whether it takes a reduction, whether its count is the output's)
        self._entries = {
            "all_reduce": (lib.ncclAllReduce, True, False),
            "all_gather": (lib.ncclAllGather, False, False),
            "reduce_scatter": (lib.ncclReduceScatter, True, True),
        }

    def _init_comm(self, world: int, uid: UniqueId, rank: int) -> None:
        """Create the communicator with the variant's settings; NCCL's refusal is the variant's reason."""
        variant, lib = self.variant, self.nccl.lib
        if variant.channels is not None and not (self.nccl.has_config and self.nccl.version() >= 21700):
            raise BackendUnavailable("a channel count needs ncclCommInitRankConfig (NCCL 2.17 or newer)")
        try:
            with nccl_environment(variant.environment()):
                if variant.channels is None:
                    self.nccl.check(lib.ncclCommInitRank(ctypes.byref(self.comm), world, uid, rank), "ncclCommInitRank")
                else:
                    config = CommConfig.with_channels(variant.channels)
                    self.nccl.check(
                        lib.ncclCommInitRankConfig(ctypes.byref(self.comm), world, uid, rank, ctypes.byref(config)),
                        "ncclCommInitRankConfig",
                    )
        except RuntimeError as exc:
            if not variant.settings():
                raise
            raise BackendUnavailable(f"NCCL refused {variant.settings()}: {exc}") from None

    def supports(self, op: str, dtype: torch.dtype, nbytes: int) -> bool:
        return dtype in DTYPES

    def _arguments(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> tuple:
        """The entry point of `op` and its arguments on these buffers, all but the stream."""
        fn, reduces, counts_output = self._entries[op]
        count = (out if counts_output else inp).numel()
        return fn, (inp.data_ptr(), out.data_ptr(), count, DTYPES[inp.dtype], *((SUM,) if reduces else ()), self.comm)

    def _launch(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
        fn, args = self._arguments(op, inp, out)
        rc = fn(*args, self._stream(self.device_index))
        if rc:
            self.nccl.check(rc, f"nccl {op}")

    def bind(self, op: str, inp: torch.Tensor, out: torch.Tensor):
        """The op on these buffers as a zero-argument call: only the stream is looked up per call."""
        fn, (src, dst, count, *rest) = self._arguments(op, inp, out)
        head = (ctypes.c_void_p(src), ctypes.c_void_p(dst), ctypes.c_size_t(count), *rest)  # converted once
        stream, index, nccl, name = self._stream, self.device_index, self.nccl, f"nccl {op}"

        def call() -> None:
            rc = fn(*head, stream(index))
            if rc:
                nccl.check(rc, name)

        return call

    def bind_rotation(self, op: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> Rotation:
        """Calls of `op` rotating through these buffer pairs, with `repeat(n, start, end)` for a C loop of n launches."""
        return Rotation(self, op, ins, outs, launch_loop()[0])

    def effective_options(self) -> dict:
        loop = launch_loop()[1]
        variant = {"variant": self.variant.settings()} if self.variant.settings() else {}
        return {"eager_loop": loop, "eager_events": event_record()[1] if loop == "c" else "python", **variant}

    def all_reduce(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self._launch("all_reduce", inp, out)

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self._launch("all_gather", inp, out)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        self._launch("reduce_scatter", inp, out)

    def close(self) -> None:
        if self.comm:
            torch.cuda.synchronize(self.device_index)
            self.nccl.lib.ncclCommDestroy(self.comm)
            self.comm = ctypes.c_void_p()
