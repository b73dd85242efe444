"""The GPU rank: launches the kernels against its segment; capturable, no host sync per call.

The segment is mapped here and registered with CUDA (cudaHostRegister, portable
and mapped); with unified addressing the GPU reaches it at the same address. So
are the peers' segments over the shared-memory fabric, whose staging the kernels
read.
`check()` reads the error word: call it after synchronising (graph replays) to
turn a timed-out wait into an error naming peer and op; eager calls run it first.
"""

from __future__ import annotations

import torch

from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph.plan import inbox_bytes
from arxtune.runtime.rdma.graph.segment import MAX_PARTS, OP_CODES
from arxtune.runtime.rdma.graph.session import Session

_HOST_REGISTER_PORTABLE, _HOST_REGISTER_MAPPED = 1, 2
#: dtypes the kernels sum exactly as the CPU stand-in does (float32 accumulation for 16-bit floats)
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.int32)


class HostPtr:
    """A typed pointer into registered host memory, passed to Triton like a tensor."""

    def __init__(self, address: int, dtype: torch.dtype):
        self.address, self.dtype = address, dtype

    def data_ptr(self) -> int:
        return self.address


class GpuRank:
    def __init__(self, session: Session, device: torch.device):
        from arxtune.runtime.rdma.graph import kernels  # Triton: imported only where a GPU rank runs

        self.k, self.s, self.device = kernels, session, device
        if session.world > kernels.MAX_WORLD:
            raise RdmaUnavailable(f"arxg: world size {session.world} exceeds the kernels' {kernels.MAX_WORLD} ranks")
        seg = session.segment
        self._registered: list[int] = []
        with torch.cuda.device(device):
            for segment in (seg, *session.peers.values()):
                rc = torch.cuda.cudart().cudaHostRegister(segment.address, segment.size,
                                                          _HOST_REGISTER_PORTABLE | _HOST_REGISTER_MAPPED)
                if int(rc) != 0:
                    self._unregister()
                    raise RdmaUnavailable(f"arxg: cudaHostRegister of a shared segment failed (error {int(rc)}); "
                                          "the GPU cannot reach host memory here")
                self._registered.append(segment.address)
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

    def run(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Stage, ring, wait, finish: one kernel on the current stream, recorded if it is capturing."""
        s, L, k = self.s, self.s.layout, self.k
        if not torch.cuda.is_current_stream_capturing():
            s.check()
        n_in = inp.numel()
        nbytes = n_in * inp.element_size()
        if nbytes > L.slot_bytes:
            raise ValueError(f"arxg: {op} input of {nbytes} bytes exceeds max_bytes = {L.slot_bytes}")
        slot_elems = L.slot_bytes // inp.element_size()
        staging = self._ptr(L.staging(0), inp.dtype)
        n_part = inbox_bytes(op, nbytes, s.world) // inp.element_size()
        blocks = max(triton_cdiv(n_in, k.BLOCK), triton_cdiv(n_part, k.BLOCK))
        k.collective_kernel[(min(blocks, self.max_programs),)](
            inp, out, staging, self.sources, self.flags, self.ctrl, self.counter, s.rank, n_in, n_part, slot_elems, nbytes,
            s.flag_devices(op, nbytes), OP_CODES[op], self.timeout_ns, OP=OP_CODES[op], WORLD=s.world, NDEV=L.ndev,
            INT_ACC=not inp.dtype.is_floating_point, BLOCK=k.BLOCK, num_warps=k.NUM_WARPS)

    def all_reduce(self, inp, out):
        self.run("all_reduce", inp, out)

    def all_gather(self, inp, out):
        self.run("all_gather", inp, out)

    def reduce_scatter(self, inp, out):
        self.run("reduce_scatter", inp, out)

    def handshake(self) -> None:
        """Ring and wait for the proxy, nothing else: the floor of a step (every rank must do the same)."""
        self.k.handshake_kernel[(1,)](self.ctrl, self.counter, OP_CODES["handshake"], self.timeout_ns, num_warps=1)

    def check(self) -> None:
        self.s.check()

    def close(self) -> None:
        torch.cuda.synchronize(self.device)
        with torch.cuda.device(self.device):
            self._unregister()
        self.s.close()


def triton_cdiv(a: int, b: int) -> int:
    return max(1, (a + b - 1) // b)
