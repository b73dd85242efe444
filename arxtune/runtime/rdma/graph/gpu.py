"""The GPU rank: launches the kernels against its segment; capturable, no host sync per call.

The segment is mapped here; the device reaches it, and the peers' segments over
the shared-memory fabric (whose staging the kernels read), at the host's
addresses, in the memory mode memory.py chooses: registered with CUDA
(cudaHostRegister, portable and mapped) or read directly (pageable memory
access: nothing registered).
The kernels are builds for this GPU's arch (images.py: found on disk, or built
here with Triton at first use) loaded through the CUDA driver, and every call,
eager or captured into a graph, is one launch from C (runtime/cudadrv.py) with
its arguments packed once per buffer pair. An eager call first checks the error
word and the proxy's heartbeat (Session.quick_check: no system call while both
are fine), and wakes the proxy if it blocks. `launch="triton"` keeps Triton's
own per-call `kernel[grid](...)` path, for comparison.
`check()` reads the error word: call it after synchronising (graph replays) to
turn a timed-out wait into an error naming peer and op.
"""

from __future__ import annotations

import threading

import torch

from arxtune.runtime import cudadrv
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph import abi, images
from arxtune.runtime.rdma.graph import memory as _memory
from arxtune.runtime.rdma.graph.aot import Variant, aligned
from arxtune.runtime.rdma.graph.plan import inbox_bytes
from arxtune.runtime.rdma.graph.segment import ASLEEP, MAX_PARTS, OP_CODES, WAKE
from arxtune.runtime.rdma.graph.session import Session

_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED = 1, 2
#: dtypes the kernels sum exactly as the CPU stand-in does (float32 accumulation for 16-bit floats)
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)
#: how calls reach the kernel: the driver from C with packed arguments, or Triton's own `kernel[grid](...)`
LAUNCHES = ("native", "triton")
#: older names of a launch, still read
OLD_LAUNCHES = {"cached": "native"}
#: packed launches kept per rank (one per buffer pair seen); a full cache starts over
MAX_PACKED = 4096
#: (context, source, arch, variant) -> its loaded kernel, shared by every rank of the process: loading a
#: module waits for the GPU to go idle, so a rank that loaded its own while a peer's kernel spins on the same
#: GPU (ranks sharing a process: tests, benchmarks) would wait for that kernel's timeout
_LOADED: dict[tuple, int] = {}
_LOADING = threading.Lock()


class HostPtr:
    """A typed pointer into host memory the device reaches, passed to Triton like a tensor."""

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


def address(value) -> int:
    """A pointer argument as an integer; anything else unchanged."""
    return value.data_ptr() if hasattr(value, "data_ptr") else value


class GpuRank:
    def __init__(
        self,
        session: Session,
        device: torch.device,
        memory: str = "auto",
        launch: str = "native",
        attributes=_memory.read_attributes,
        obtain=images.obtain,
    ):
        """`memory`: "auto", "registered" or "direct" (memory.py), from what `attributes(ordinal)` reads of the
        device; `launch`: "native" or "triton"; `obtain(variant, capability)` finds or builds a kernel image
        (images.obtain). RdmaUnavailable says why this device cannot run arxg."""
        launch = OLD_LAUNCHES.get(launch, launch)
        if launch not in LAUNCHES:
            raise RdmaUnavailable(f"arxg: unknown launch {launch!r}; use one of {', '.join(LAUNCHES)}")
        self.s, self.device, self.launch, self._obtain = session, device, launch, obtain
        if session.world > abi.MAX_WORLD:
            raise RdmaUnavailable(f"arxg: world size {session.world} exceeds the kernels' {abi.MAX_WORLD} ranks")
        self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.memory = _memory.choose(attributes(self.index), memory)
        if self.memory.mode == "direct" and launch == "triton":
            raise RdmaUnavailable(
                "arxg: Triton's own launch path asks the driver about every pointer, which pageable "
                "memory fails: the direct memory mode needs launch = 'native'"
            )
        self.k = None
        if launch == "triton":
            try:
                from arxtune.runtime.rdma.graph import kernels
            except ImportError as exc:
                raise RdmaUnavailable(f"arxg: launch = 'triton' needs Triton ({exc})") from None
            self.k = kernels
        seg = session.segment
        self._registered: list[int] = []
        with torch.cuda.device(self.index):
            major, minor = torch.cuda.get_device_capability(self.index)
            self.capability = 10 * major + minor
            for segment in (seg, *session.peers.values()):
                if self.memory.mode == "registered":
                    self._register(segment)
                else:
                    segment.touch()  # pages exist before the device's first access: no fault on the step's path
            self.sources = self._sources()
            self.counter = torch.zeros(4, dtype=torch.int64, device=device)  # step, arrived, unused, verdict (kernels.py)
            # a persistent grid: every program resident, so program 0 may spin while the others finish staging;
            # each program rings a bell of its own in the segment
            self.max_programs = min(torch.cuda.get_device_properties(device).multi_processor_count, MAX_PARTS)
            self.ctx = cudadrv.current_context() if launch == "native" else 0
        self.data = seg.data_address
        self.ctrl = HostPtr(seg.address, torch.int64)
        self.flags = HostPtr(self.data + session.layout.flags_base, torch.int64)
        self.timeout_ns = int(session.cfg.timeout_s * 1e9)
        self._wake = (seg.address + 8 * ASLEEP, seg.address + 8 * WAKE)
        self._ptrs: dict[tuple, HostPtr] = {}
        self._functions: dict[str, tuple[int, abi.KernelImage]] = {}
        #: variant -> where its build came from (images.obtain): what a run records
        self.builds: dict[str, str] = {}
        self._packed: dict[tuple, cudadrv.Launch] = {}
        self._entries = None  # the driver's launch entry points (tests: stand-ins)
        if launch == "native":
            try:
                self._launch_c = cudadrv.c_entry("arxtune_launch")
                self._function(Variant("handshake"))  # a build for this arch, or the reason there is none, now
            except OSError as exc:
                self._unregister()
                raise RdmaUnavailable(f"arxg: the native launcher cannot be built here ({exc}); use launch = 'triton'") from None
            except BaseException:
                self._unregister()
                raise

    def _register(self, segment) -> None:
        rc = torch.cuda.cudart().cudaHostRegister(segment.address, segment.size, _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
        if int(rc) != 0:
            self._unregister()
            raise RdmaUnavailable(
                f"arxg: cudaHostRegister of a shared segment failed (error {int(rc)}) in memory mode "
                f"{self.memory}; the GPU cannot reach host memory this way"
            )
        self._registered.append(segment.address)

    def _sources(self) -> torch.Tensor:
        """Where each rank's part of a step in each slot starts, and whether it holds every piece
        (the table collective_kernel reads), in device memory."""
        s, width = self.s, abi.MAX_WORLD
        table = [0] * (3 * width)
        for src in range(s.world):
            for slot in range(2):
                segment, offset = s.source(src, slot, "all_reduce", 0)
                table[slot * width + src] = segment.data_address + offset
            table[2 * width + src] = int(s.reads_staging(src))
        return torch.tensor(table, dtype=torch.int64, device=self.device)

    def _unregister(self) -> None:
        for address in self._registered:
            torch.cuda.cudart().cudaHostUnregister(address)
        self._registered = []

    def _ptr(self, offset: int, dtype: torch.dtype) -> HostPtr:
        p = self._ptrs.get((offset, dtype))
        if p is None:
            p = self._ptrs[(offset, dtype)] = HostPtr(self.data + offset, dtype)
        return p

    def _collective_args(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> tuple[tuple[int], dict]:
        """(grid, every argument of collective_kernel by name) for this call."""
        s, L = self.s, self.s.layout
        n_in = inp.numel()
        nbytes = n_in * inp.element_size()
        if nbytes > L.slot_bytes:
            raise ValueError(f"arxg: {op} input of {nbytes} bytes exceeds max_bytes = {L.slot_bytes}")
        n_part = inbox_bytes(op, nbytes, s.world) // inp.element_size()
        blocks = max(cdiv(n_in, abi.BLOCK), cdiv(n_part, abi.BLOCK))
        return (min(blocks, self.max_programs),), dict(
            inp=inp,
            out=out,
            staging=self._ptr(L.staging(0), inp.dtype),
            sources=self.sources,
            flags=self.flags,
            ctrl=self.ctrl,
            counter=self.counter,
            rank=s.rank,
            n_stage=n_in,
            n_part=n_part,
            slot_elems=L.slot_bytes // inp.element_size(),
            nbytes=nbytes,
            ndev_used=s.flag_devices(op, nbytes),
            op_code=OP_CODES[op],
            timeout_ns=self.timeout_ns,
            OP=OP_CODES[op],
            WORLD=s.world,
            NDEV=L.ndev,
            INT_ACC=not inp.dtype.is_floating_point,
            BLOCK=abi.BLOCK,
        )

    def _function(self, variant: Variant) -> tuple[int, abi.KernelImage]:
        """The loaded kernel of `variant` (found or built at its first use, then loaded into this device's context)."""
        found = self._functions.get(variant.name)
        if found is None:
            image, how = self._obtain(variant, self.capability)
            try:
                func = self._load(image)
            except cudadrv.CudaError as exc:
                raise RdmaUnavailable(f"arxg: the build of {variant.name} {how} does not load on this GPU: {exc}") from None
            found = self._functions[variant.name] = (func, image)
            self.builds[variant.name] = how
        return found

    def _load(self, image: abi.KernelImage) -> int:
        key = (self.ctx, image.source, image.arch, image.variant)
        with _LOADING:
            func = _LOADED.get(key)
            if func is None:
                with torch.cuda.device(self.index):
                    func = _LOADED[key] = cudadrv.load_function(image.cubin, image.name, image.shared)
        return func

    def _pack(self, image: abi.KernelImage, func: int, grid: tuple[int, ...], named: dict) -> cudadrv.Launch:
        values = image.values({k: address(v) for k, v in named.items()})
        return cudadrv.Launch(
            func, grid, (32 * image.num_warps,), image.shared, image.params, values, ctx=self.ctx, wake=self._wake, entries=self._entries
        )

    def prepare(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> cudadrv.Launch:
        """The packed launch of `op` on this buffer pair (made once, then kept)."""
        key = (op, inp.dtype, inp.numel(), inp.data_ptr(), out.data_ptr())
        launch = self._packed.get(key)
        if launch is None:
            if out.dtype != inp.dtype:
                raise ValueError(f"arxg: {op} needs one dtype, not {inp.dtype} in and {out.dtype} out")
            grid, named = self._collective_args(op, inp, out)
            variant = Variant(
                "collective",
                op,
                str(inp.dtype).removeprefix("torch."),
                self.s.world,
                self.s.layout.ndev,
                aligned({k: address(v) for k, v in named.items()}),
            )
            func, image = self._function(variant)
            if len(self._packed) >= MAX_PACKED:
                self._packed.clear()
            launch = self._packed[key] = self._pack(image, func, grid, named)
        return launch

    def run(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Stage, ring, wait, finish: one kernel on the current stream, recorded if it is capturing."""
        self.s.quick_check()  # reads two host words: harmless while capturing too
        if self.launch == "triton":
            grid, named = self._collective_args(op, inp, out)
            kernel = self.k.collective_kernel
            kernel[grid](*[named[n] for n in kernel.arg_names], num_warps=abi.NUM_WARPS)
            return
        launch = self._packed.get((op, inp.dtype, inp.numel(), inp.data_ptr(), out.data_ptr())) or self.prepare(op, inp, out)
        rc = self._launch_c(launch.address, cudadrv.current_stream(self.index))
        if rc:
            cudadrv.check(rc, f"arxg: launching {op}")

    def rotation(self, op: str, ins: list[torch.Tensor], outs: list[torch.Tensor]) -> "Rotation":
        return Rotation(self, op, ins, outs)

    def all_reduce(self, inp, out):
        self.run("all_reduce", inp, out)

    def all_gather(self, inp, out):
        self.run("all_gather", inp, out)

    def reduce_scatter(self, inp, out):
        self.run("reduce_scatter", inp, out)

    def handshake(self) -> None:
        """Ring and wait for the proxy, nothing else: the floor of a step (every rank must do the same)."""
        named = dict(ctrl=self.ctrl, counter=self.counter, op_code=OP_CODES["handshake"], timeout_ns=self.timeout_ns)
        if self.launch == "triton":
            kernel = self.k.handshake_kernel
            kernel[(1,)](*[named[n] for n in kernel.arg_names], num_warps=1)
            return
        launch = self._packed.get("handshake")  # type: ignore[call-overload]
        if launch is None:
            func, image = self._function(Variant("handshake"))
            launch = self._packed["handshake"] = self._pack(image, func, (1,), named)  # type: ignore[index]
        cudadrv.check(self._launch_c(launch.address, cudadrv.current_stream(self.index)), "arxg: launching a handshake")

    def check(self) -> None:
        self.s.check()

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            self._unregister()
        self.s.close()


def cdiv(a: int, b: int) -> int:
    return max(1, (a + b - 1) // b)


class Rotation:
    """Calls of one op rotating through buffer pairs (the sweep's timed op): one from Python per call(), or
    launched back to back from C (`repeat`, and `decode` with a busy kernel before each), each pair's arguments
    packed once. With launch = "triton" only the Python call is offered."""

    def __init__(self, rank: GpuRank, op: str, ins: list[torch.Tensor], outs: list[torch.Tensor]):
        self.rank, self.op, self.pairs = rank, op, list(zip(ins, outs))
        self._next, self._launches = 0, None
        native = rank.launch == "native"
        self.repeat = self._repeat if native else None
        self.decode = self._decode if native else None

    @property
    def launches(self) -> list[cudadrv.Launch]:
        """Each pair's packed launch, made at the first call (where a missing build is the call's error)."""
        if self._launches is None:
            self._launches = [self.rank.prepare(self.op, i, o) for i, o in self.pairs]  # type: ignore[assignment]
        return self._launches

    def __call__(self) -> None:
        inp, out = self.pairs[self._next]
        self._next = (self._next + 1) % len(self.pairs)
        self.rank.run(self.op, inp, out)

    def _repeat(self, calls: int, start=None, end=None) -> None:
        self.rank.s.quick_check()
        cudadrv.burst(self.launches, calls, cudadrv.current_stream(self.rank.index), start=start, end=end)

    def _decode(self, calls: int, busy, start=None, end=None) -> None:
        """`calls` times a busy kernel then the op, launched back to back from C (the decode view)."""
        self.rank.s.quick_check()
        cudadrv.burst(self.launches, calls, cudadrv.current_stream(self.rank.index), before=busy.launch, start=start, end=end)
