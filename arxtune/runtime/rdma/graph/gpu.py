"""The GPU rank: launches the kernels against its segment; capturable, no host sync per call.

The segment is mapped here; the device reaches it, and the peers' segments over
the shared-memory fabric (whose staging the kernels read), at the host's
addresses, in the memory mode memory.py chooses: registered with CUDA
(cudaHostRegister, portable and mapped) or read directly (pageable memory
access: nothing registered).
Eager calls launch through a cached launcher (launch.py) and check the error
word and the proxy's heartbeat first (Session.quick_check: no system call while
both are fine); `launch="triton"` keeps Triton's own per-call path.
`check()` reads the error word: call it after synchronising (graph replays) to
turn a timed-out wait into an error naming peer and op.
"""

from __future__ import annotations

import torch

from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph import memory as _memory
from arxtune.runtime.rdma.graph.launch import Launch, names_in_order
from arxtune.runtime.rdma.graph.plan import inbox_bytes
from arxtune.runtime.rdma.graph.segment import MAX_PARTS, OP_CODES
from arxtune.runtime.rdma.graph.session import Session

_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED = 1, 2
#: dtypes the kernels sum exactly as the CPU stand-in does (float32 accumulation for 16-bit floats)
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)
#: how eager calls reach the kernel: a cached launcher, or Triton's own `kernel[grid](...)` every call
LAUNCHES = ("cached", "triton")


class HostPtr:
    """A typed pointer into host memory the device reaches, passed to Triton like a tensor."""

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


class GpuRank:
    def __init__(self, session: Session, device: torch.device, memory: str = "auto", launch: str = "cached",
                 attributes=_memory.read_attributes):
        """`memory`: "auto", "registered" or "direct" (memory.py), from what `attributes(ordinal)` reads of the
        device; `launch`: "cached" or "triton". RdmaUnavailable says why this device cannot run arxg."""
        from arxtune.runtime.rdma.graph import kernels  # Triton: imported only where a GPU rank runs

        if launch not in LAUNCHES:
            raise RdmaUnavailable(f"arxg: unknown launch {launch!r}; use one of {', '.join(LAUNCHES)}")
        self.k, self.s, self.device, self.launch = kernels, session, device, launch
        if session.world > kernels.MAX_WORLD:
            raise RdmaUnavailable(f"arxg: world size {session.world} exceeds the kernels' {kernels.MAX_WORLD} ranks")
        ordinal = device.index if device.index is not None else torch.cuda.current_device()
        self.memory = _memory.choose(attributes(ordinal), memory)
        if self.memory.mode == "direct" and launch == "triton":
            raise RdmaUnavailable("arxg: Triton's own launch path asks the driver about every pointer, which pageable "
                                  "memory fails: the direct memory mode needs launch = 'cached'")
        seg = session.segment
        self._registered: list[int] = []
        with torch.cuda.device(device):
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
        self.data = seg.data_address
        self.ctrl = HostPtr(seg.address, torch.int64)
        self.flags = HostPtr(self.data + session.layout.flags_base, torch.int64)
        self.timeout_ns = int(session.cfg.timeout_s * 1e9)
        self._ptrs: dict[tuple, HostPtr] = {}
        self._launches: dict[tuple, Launch] = {}

    def _register(self, segment) -> None:
        rc = torch.cuda.cudart().cudaHostRegister(segment.address, segment.size,
                                                  _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
        if int(rc) != 0:
            self._unregister()
            raise RdmaUnavailable(f"arxg: cudaHostRegister of a shared segment failed (error {int(rc)}) in memory mode "
                                  f"{self.memory}; the GPU cannot reach host memory this way")
        self._registered.append(segment.address)

    def _sources(self) -> torch.Tensor:
        """Where each rank's part of a step in each slot starts, and whether it holds every piece
        (the table collective_kernel reads), in device memory."""
        s, width = self.s, self.k.MAX_WORLD
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
        s, L, k = self.s, self.s.layout, self.k
        n_in = inp.numel()
        nbytes = n_in * inp.element_size()
        if nbytes > L.slot_bytes:
            raise ValueError(f"arxg: {op} input of {nbytes} bytes exceeds max_bytes = {L.slot_bytes}")
        n_part = inbox_bytes(op, nbytes, s.world) // inp.element_size()
        blocks = max(triton_cdiv(n_in, k.BLOCK), triton_cdiv(n_part, k.BLOCK))
        return (min(blocks, self.max_programs),), dict(
            inp=inp, out=out, staging=self._ptr(L.staging(0), inp.dtype), sources=self.sources, flags=self.flags,
            ctrl=self.ctrl, counter=self.counter, rank=s.rank, n_stage=n_in, n_part=n_part,
            slot_elems=L.slot_bytes // inp.element_size(), nbytes=nbytes, ndev_used=s.flag_devices(op, nbytes),
            op_code=OP_CODES[op], timeout_ns=self.timeout_ns, OP=OP_CODES[op], WORLD=s.world, NDEV=L.ndev,
            INT_ACC=not inp.dtype.is_floating_point, BLOCK=k.BLOCK)

    def run(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Stage, ring, wait, finish: one kernel on the current stream, recorded if it is capturing."""
        self.s.quick_check()  # reads two host words: harmless while capturing too
        if self.launch == "triton":
            grid, named = self._collective_args(op, inp, out)
            self.k.collective_kernel[grid](*names_in_order(self.k.collective_kernel, named), num_warps=self.k.NUM_WARPS)
            return
        src, dst = inp.data_ptr(), out.data_ptr()
        # everything Triton specialises on follows from these (sizes from the count, 16-byte alignment of the two)
        key = (op, inp.dtype, out.dtype, inp.numel(), src % 16 == 0, dst % 16 == 0)
        launch = self._launches.get(key)
        if launch is None:
            grid, named = self._collective_args(op, inp, out)
            kernel = self.k.collective_kernel
            launch = self._launches[key] = Launch.compile(kernel, grid, names_in_order(kernel, named),
                                                  (kernel.arg_names.index("inp"), kernel.arg_names.index("out")),
                                                  self.device, num_warps=self.k.NUM_WARPS)
        launch(src, dst)

    def all_reduce(self, inp, out):
        self.run("all_reduce", inp, out)

    def all_gather(self, inp, out):
        self.run("all_gather", inp, out)

    def reduce_scatter(self, inp, out):
        self.run("reduce_scatter", inp, out)

    def handshake(self) -> None:
        """Ring and wait for the proxy, nothing else: the floor of a step (every rank must do the same)."""
        k = self.k
        named = dict(ctrl=self.ctrl, counter=self.counter, op_code=OP_CODES["handshake"], timeout_ns=self.timeout_ns)
        if self.launch == "triton":
            k.handshake_kernel[(1,)](*names_in_order(k.handshake_kernel, named), num_warps=1)
            return
        launch = self._launches.get("handshake")
        if launch is None:
            launch = self._launches["handshake"] = Launch.compile(k.handshake_kernel, (1,), names_in_order(k.handshake_kernel, named),
                                                          (), self.device, num_warps=1)
        launch()

    def check(self) -> None:
        self.s.check()

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            self._unregister()
        self.s.close()


def triton_cdiv(a: int, b: int) -> int:
    return max(1, (a + b - 1) // b)
