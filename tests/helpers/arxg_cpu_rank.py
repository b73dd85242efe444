"""Test ranks of arxg: the CPU stand-in (a CPU rank running the GPU side's protocol against its proxy),
and several GPU ranks sharing one GPU.

It stages into its segment, rings the doorbell, polls flags and finishes the step
(sum in fixed rank order, float32 accumulation for 16-bit floats, as the kernels
do), so its results are bit-identical to a GPU rank's. It pairs with a GPU rank
on a one-GPU machine, and stands in for the GPU where there is none (the RDMA tier).
"""

from __future__ import annotations

import os
import time

import torch

from arxtune.runtime.rdma.protocol import seq_of
from arxtune.runtime.rdma.graph.plan import inbox_bytes
from arxtune.runtime.rdma.graph.segment import DESC, DOORBELL, ERR_PEER_TIMEOUT, ERR_PROXY_TIMEOUT, OP_CODES, PARTS, SENT
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.graph.gpu import GpuRank
from arxtune.runtime.rdma.graph.session import Session, open_local

_SPINS_BEFORE_YIELD = 2000


def accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype sums are taken in, on the GPU and here alike."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _typed(where: tuple, count: int, dtype: torch.dtype) -> torch.Tensor:
    segment, offset = where
    return segment.typed(offset, count, dtype)


class CpuRank:
    """Stateful like the GPU side: every rank must call the same ops in the same order."""

    def __init__(self, session: Session):
        self.s = session
        self.step = 0

    def _wait(self, words, index: int, want: int, code: int, peer: int, seq: int) -> None:
        deadline, spins = time.monotonic() + self.s.cfg.timeout_s, 0
        while words[index] < want:
            spins += 1
            if spins > _SPINS_BEFORE_YIELD:
                os.sched_yield()
                if spins % 64 == 0:
                    self.s.check()
                    if time.monotonic() > deadline:
                        self.s.segment.set_error(code, peer, seq)
                        self.s.check()

    def _describe(self, op_code: int, nbytes: int) -> None:
        """The step's descriptor; the stand-in stages as one part, so the doorbell is its only bell."""
        ctrl, slot = self.s.segment.control, self.s.layout.slot(self.step)
        ctrl[DESC + 2 * slot], ctrl[DESC + 2 * slot + 1], ctrl[PARTS + slot] = op_code, nbytes, 1

    def run(self, op: str, inp: torch.Tensor, out: torch.Tensor) -> None:
        """One collective (shapes as in backends.base), CPU tensors."""
        s, seg, L = self.s, self.s.segment, self.s.layout
        k, seq = self.step, seq_of(self.step)
        nbytes = inp.numel() * inp.element_size()
        s.check()
        self._wait(seg.control, SENT, seq - 2, ERR_PROXY_TIMEOUT, -1, seq - 2)  # staging slot free
        seg.typed(L.staging(k), inp.numel(), inp.dtype).copy_(inp.reshape(-1))
        self._describe(OP_CODES[op], nbytes)
        seg.control[DOORBELL] = seq
        self.step += 1
        ndev = s.flag_devices(op, nbytes)
        for src in range(s.world):
            if src != s.rank:
                for dev in range(ndev):
                    self._wait(seg.flags, L.flag_index(k, src, dev), seq, ERR_PEER_TIMEOUT, src, seq)
        n = inbox_bytes(op, nbytes, s.world) // inp.element_size()
        flat_in = inp.reshape(-1)
        own = flat_in[s.rank * n : (s.rank + 1) * n] if op == "reduce_scatter" else flat_in
        parts = [own if src == s.rank else _typed(s.source(src, k, op, nbytes), n, inp.dtype) for src in range(s.world)]
        flat = out.reshape(-1)
        if op == "all_gather":
            for src, part in enumerate(parts):
                flat[src * n : (src + 1) * n] = part
            return
        acc = torch.zeros(n, dtype=accumulator(inp.dtype))
        for part in parts:
            acc += part
        flat.copy_(acc)

    def all_reduce(self, inp, out):
        self.run("all_reduce", inp, out)

    def all_gather(self, inp, out):
        self.run("all_gather", inp, out)

    def reduce_scatter(self, inp, out):
        self.run("reduce_scatter", inp, out)

    def handshake(self) -> None:
        """Ring and wait for the proxy's answer, nothing else (the floor of a step)."""
        seg, seq = self.s.segment, seq_of(self.step)
        self._describe(OP_CODES["handshake"], 0)
        seg.control[DOORBELL] = seq
        self.step += 1
        self._wait(seg.control, SENT, seq, ERR_PROXY_TIMEOUT, -1, seq)


class RanksOnOneGpu:
    """`world` GPU ranks in this process on one GPU, one stream each, over the shared-memory fabric:
    the one-GPU pairing for tests and benchmarks (the kernels of different ranks run concurrently)."""

    def __init__(self, world: int, cfg: RdmaConfig, device: int = 0, memory: str = "auto", launch: str = "native"):
        sessions = open_local(cfg, world)
        self.ranks = []
        try:
            for s in sessions:
                self.ranks.append(GpuRank(s, torch.device("cuda", device), memory=memory, launch=launch))
        except BaseException:
            for r in self.ranks:
                r.close()
            for s in sessions[len(self.ranks) :]:
                s.close()
            raise
        self.streams = [torch.cuda.Stream() for _ in self.ranks]

    def collective(self, op: str, ins, outs, repeat: int = 1) -> None:
        """`repeat` collectives on every rank, each rank's chain on its stream, joined back into the
        current stream at the end: between calls the ranks meet only through the protocol, as ranks
        on different GPUs do."""
        cur = torch.cuda.current_stream()
        for s in self.streams:
            s.wait_stream(cur)
        for rank, s, i, o in zip(self.ranks, self.streams, ins, outs):
            with torch.cuda.stream(s):
                for _ in range(repeat):
                    getattr(rank, op)(i, o)
        for s in self.streams:
            cur.wait_stream(s)

    def launch_peers(self, op: str, ins, outs, repeat: int) -> None:
        """`repeat` calls on every rank but rank 0, each rank's chain on its stream after the current stream's
        work. Launched ahead, they wait in the protocol for rank 0's calls, so rank 0's own launches set the
        pace, as each rank's process launches only its own calls. Rank 0's calls go on the current stream."""
        cur = torch.cuda.current_stream()
        for rank, s, i, o in zip(self.ranks[1:], self.streams[1:], ins[1:], outs[1:]):
            s.wait_stream(cur)
            with torch.cuda.stream(s):
                for _ in range(repeat):
                    getattr(rank, op)(i, o)

    def check(self) -> None:
        for r in self.ranks:
            r.check()

    def close(self) -> None:
        for r in self.ranks:
            r.close()
