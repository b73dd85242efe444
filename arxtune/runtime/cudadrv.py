"""The CUDA driver API through ctypes, for what torch does not offer: loading a compiled kernel (cubin or
PTX) and launching it from C with its arguments packed once.

A `Launch` is one kernel, one grid and one argument block, filled once (per
buffer pair, for a collective); calling it costs one ctypes call into
cuda_launch.c, which calls cuLaunchKernel on the current stream (captured into
a CUDA graph while the stream captures). `burst` launches a run of them back to
back from C with the sample's two events around them, as nccl-tests launches
NCCL. `BusyKernel` is the decode view's stand-in for a layer's compute: a
kernel that spins on the GPU's nanosecond timer for a set time.

The driver's entry points are handed to the C file as pointers, so it builds
without CUDA headers or libcuda. Nothing here imports Triton.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from pathlib import Path
from typing import Sequence

from arxtune.runtime import native

SOURCE = Path(__file__).with_name("cuda_launch.c")
#: CUfunction_attribute numbers (cuda.h)
MAX_DYNAMIC_SHARED = 8
#: Dynamic shared memory a kernel gets without asking for more (cuFuncSetAttribute).
DEFAULT_SHARED_LIMIT = 48 << 10


class CudaError(RuntimeError):
    pass


class LaunchStruct(ctypes.Structure):
    """arxtune_launch_t in cuda_launch.c."""

    _fields_ = [
        ("launch", ctypes.c_void_p),
        ("set_ctx", ctypes.c_void_p),
        ("ctx", ctypes.c_void_p),
        ("func", ctypes.c_void_p),
        ("grid", ctypes.c_uint32 * 3),
        ("block", ctypes.c_uint32 * 3),
        ("shared", ctypes.c_uint32),
        ("pad", ctypes.c_uint32),
        ("params", ctypes.c_void_p),
        ("asleep", ctypes.c_void_p),
        ("wake", ctypes.c_void_p),
    ]


@functools.lru_cache(maxsize=1)
def libcuda() -> ctypes.CDLL:
    """The driver library; OSError where there is none."""
    lib = ctypes.CDLL("libcuda.so.1")
    rc = lib.cuInit(0)
    if rc:
        raise OSError(f"cuInit failed (CUresult {rc})")
    return lib


def error_name(rc: int) -> str:
    text = ctypes.c_char_p()
    try:
        libcuda().cuGetErrorName(rc, ctypes.byref(text))
    except OSError:
        pass
    return f"{text.value.decode()} ({rc})" if text.value else f"CUresult {rc}"


def check(rc: int, what: str) -> None:
    if rc:
        raise CudaError(f"{what} failed: {error_name(rc)}")


def entry(name: str) -> int:
    """The address of a driver function, for the C file."""
    return ctypes.cast(getattr(libcuda(), name), ctypes.c_void_p).value


@functools.lru_cache(maxsize=1)
def _c():
    """The compiled cuda_launch.c (OSError where no compiler works)."""
    lib = ctypes.CDLL(str(native.build(SOURCE)))
    vp = ctypes.c_void_p
    lib.arxtune_launch.restype = ctypes.c_int
    lib.arxtune_launch.argtypes = [vp, vp]
    lib.arxtune_launch_burst.restype = ctypes.c_int
    lib.arxtune_launch_burst.argtypes = [vp, ctypes.c_int, ctypes.c_int, vp, vp, vp, vp, vp]
    return lib


def c_entry(name: str):
    """A function of the compiled cuda_launch.c (arxtune_launch, arxtune_launch_burst)."""
    return getattr(_c(), name)


def current_context() -> int:
    ctx = ctypes.c_void_p()
    check(libcuda().cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
    if not ctx.value:
        raise CudaError("no CUDA context is current on this thread (use the device from torch first)")
    return ctx.value


def load_function(image: bytes, name: str, shared: int = 0) -> int:
    """Load a cubin or PTX image into the current context and return its kernel `name` (CUfunction).

    The module stays loaded for the life of the process (its kernels may sit in captured graphs)."""
    lib = libcuda()
    module, func = ctypes.c_void_p(), ctypes.c_void_p()
    buf = ctypes.create_string_buffer(image + (b"\0" if not image.endswith(b"\0") else b""))
    check(lib.cuModuleLoadData(ctypes.byref(module), buf), f"cuModuleLoadData of {name}")
    check(lib.cuModuleGetFunction(ctypes.byref(func), module, name.encode()), f"cuModuleGetFunction({name})")
    if shared > DEFAULT_SHARED_LIMIT:
        check(lib.cuFuncSetAttribute(func, MAX_DYNAMIC_SHARED, shared), f"cuFuncSetAttribute of {name}")
    return func.value


def pack_slots(sizes: Sequence[int], values: Sequence[int]) -> tuple[ctypes.Array, ctypes.Array]:
    """(storage, pointers): each argument in its own 8-byte slot, little-endian (an argument of 4 bytes is the
    slot's low half), and cuLaunchKernel's array of pointers to them. Integers only, 4 or 8 bytes each."""
    if sys.byteorder != "little":
        raise CudaError("packing kernel arguments assumes a little-endian host")
    if len(sizes) != len(values):
        raise ValueError(f"{len(values)} values for {len(sizes)} parameters")
    storage = (ctypes.c_uint64 * max(1, len(sizes)))()
    for i, (size, value) in enumerate(zip(sizes, values)):
        if size not in (4, 8):
            raise ValueError(f"parameter {i} has {size} bytes; only 4- and 8-byte parameters are packed")
        storage[i] = int(value) & ((1 << (8 * size)) - 1)
    base = ctypes.addressof(storage)
    pointers = (ctypes.c_void_p * max(1, len(sizes)))(*[base + 8 * i for i in range(len(sizes))])
    return storage, pointers


class Launch:
    """One kernel with its grid and arguments, packed once; `launch(stream)` from C, or `address` for a burst.

    `wake` = (asleep, wake) addresses of a proxy's futex words to wake before the launch, or None.
    `entries` = (cuLaunchKernel, cuCtxSetCurrent) addresses; tests pass fakes."""

    def __init__(
        self,
        func: int,
        grid: Sequence[int],
        block: Sequence[int],
        shared: int,
        sizes: Sequence[int],
        values: Sequence[int],
        ctx: int | None = None,
        wake: tuple[int, int] | None = None,
        entries: tuple[int, int] | None = None,
    ):
        launch, set_ctx = entries or (entry("cuLaunchKernel"), entry("cuCtxSetCurrent"))
        self._storage, self._pointers = pack_slots(sizes, values)
        s = self.struct = LaunchStruct()
        s.launch, s.set_ctx, s.ctx, s.func = launch, set_ctx if ctx else None, ctx, func
        s.grid[:] = (tuple(grid) + (1, 1, 1))[:3]
        s.block[:] = (tuple(block) + (1, 1, 1))[:3]
        s.shared, s.params = shared, ctypes.addressof(self._pointers)
        if wake is not None:
            s.asleep, s.wake = wake
        self.address = ctypes.addressof(s)
        self._one = c_entry("arxtune_launch")

    def launch(self, stream: int) -> None:
        rc = self._one(self.address, stream)
        if rc:
            check(rc, "cuLaunchKernel")


def current_stream(index: int) -> int:
    """The raw cudaStream_t of the current (or capturing) stream of device `index`, as Triton and the nccl
    backend read it."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(index) if raw is not None else torch.cuda.current_stream(index).cuda_stream


@functools.lru_cache(maxsize=1)
def event_record() -> tuple[int | None, str]:
    """(cuEventRecord's address, which takes torch's events and streams as they are, or None; where a
    burst's events are recorded: "c" or "python (why)")."""
    try:
        return entry("cuEventRecord"), "c"
    except (OSError, AttributeError) as exc:
        return None, f"python (no cuEventRecord: {exc})"


def event_handle(event) -> int:
    """A torch.cuda.Event's CUevent (torch creates it at its first record)."""
    if not event.cuda_event:
        event.record()
    return event.cuda_event


def burst(launches: Sequence[Launch], calls: int, stream: int, before: Launch | None = None, start=None, end=None) -> None:
    """`calls` launches from C, the i-th from launches[i % len], each after `before` where given, between torch
    events `start` and `end` (recorded from C) where given."""
    array = (ctypes.c_void_p * max(1, len(launches)))(*[x.address for x in launches])
    record = event_record()[0] if start is not None else None
    handles = (event_handle(start), event_handle(end)) if record else (None, None)
    if start is not None and record is None:
        start.record()
    rc = c_entry("arxtune_launch_burst")(array, len(launches), calls, before.address if before else None, stream, record, *handles)
    if start is not None and record is None:
        end.record()
    check(rc, "a burst of kernel launches")


#: The decode view's busy kernel, in PTX the driver compiles for whatever GPU it runs on: one thread spins
#: until the GPU's nanosecond timer has advanced by its argument.
BUSY_PTX = b"""
.version 6.0
.target sm_50
.address_size 64
.visible .entry arxtune_busy(.param .u64 arxtune_busy_ns)
{
    .reg .pred %p;
    .reg .b64 %rd<4>;
    ld.param.u64 %rd0, [arxtune_busy_ns];
    mov.u64 %rd1, %globaltimer;
    add.u64 %rd2, %rd1, %rd0;
SPIN:
    mov.u64 %rd3, %globaltimer;
    setp.lt.u64 %p, %rd3, %rd2;
    @%p bra SPIN;
    ret;
}
"""


class BusyKernel:
    """A kernel of `us` microseconds on one thread, standing in for a decode layer's compute (the decode view).
    Call it to launch on the current stream; `repeat(n, start, end)` launches n from C between two events."""

    def __init__(self, us: float, device_index: int):
        import torch

        with torch.cuda.device(device_index):
            torch.empty(1, device=f"cuda:{device_index}")  # the device's primary context exists and is current
            ctx = current_context()
            func = _busy_function(ctx)
        self.us, self.device_index = us, device_index
        self.launch = Launch(func, (1,), (1,), 0, [8], [int(us * 1000)], ctx=ctx)

    def __call__(self) -> None:
        self.launch.launch(current_stream(self.device_index))

    def repeat(self, calls: int, start=None, end=None) -> None:
        burst([], calls, current_stream(self.device_index), before=self.launch, start=start, end=end)


@functools.lru_cache(maxsize=None)
def _busy_function(ctx: int) -> int:
    return load_function(BUSY_PTX, "arxtune_busy")
