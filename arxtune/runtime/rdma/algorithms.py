"""Collectives over a Transport: one-shot and two-shot all-reduce, all-gather, reduce-scatter.

Each algorithm is a few steps of the flag protocol (protocol.py). Payloads go
through the registered buffer: inputs are staged into it (a copy; CPU or CUDA
source), results are reduced or copied out of it into the caller's `out`, which
stays wherever the caller put it — large gathers land in device memory, not in
pinned host memory (GEMMs reading pinned memory ran 16% slower).

The local sum adds ranks 0, 1, ..., p-1 in that order on every rank, so all
ranks get bit-identical results.
"""

from __future__ import annotations

from collections import deque
from typing import Protocol

import torch

from arxtune.runtime.rdma.protocol import Layout, chunks, split_even


class TransportLike(Protocol):
    rank: int
    world: int
    peers: list[int]
    layout: Layout
    buf: torch.Tensor

    def begin(self, step: int, op: str) -> None: ...
    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None: ...
    def wait(self, step: int, src: int, nbytes: int, op: str) -> None: ...
    def close(self) -> None: ...


class Collectives:
    """Stateful because steps are numbered: every rank must call the same ops in the same order."""

    def __init__(self, transport: TransportLike, chunk_bytes: int | None = None):
        self.t = transport
        self.L = transport.layout
        self.rank, self.world = transport.rank, transport.world
        self.chunk_bytes = chunk_bytes or self.L.slot_bytes
        self.step = 0
        self._views: dict[tuple, torch.Tensor] = {}
        self._result: torch.Tensor | None = None  # pinned scratch for two-shot results bound for a GPU
        self._device_parts: torch.Tensor | None = None  # peers' parts copied to the GPU for the sum
        self._copy_stream = None
        self._copies: deque = deque()  # (step, cuda event) of copies still reading the inbox

    # ---- helpers ----------------------------------------------------------
    def _view(self, off: int, nbytes: int, dtype: torch.dtype) -> torch.Tensor:
        """A cached typed view of the registered buffer (no tensor construction on repeat calls)."""
        key = (off, nbytes, dtype)
        v = self._views.get(key)
        if v is None:
            v = self._views[key] = self.t.buf[off : off + nbytes].view(dtype)
        return v

    def _next(self, op: str) -> int:
        k = self.step
        self.step += 1
        self._retire_copies(k + 1 - self.L.slots)
        self.t.begin(k, op)
        return k

    def _host_target(self, out: torch.Tensor, nbytes: int) -> torch.Tensor:
        """Where to reduce into: `out` itself on CPU, else a pinned scratch copied to `out` after."""
        if not out.is_cuda:
            return out
        if self._result is None:
            self._result = torch.empty(self.L.slot_bytes, dtype=torch.uint8, pin_memory=True)
        return self._result[:nbytes].view(out.dtype)

    def _reduce_into(self, k: int, out: torch.Tensor, parts: list[torch.Tensor], own: torch.Tensor) -> None:
        """Fixed-order sum of every rank's part into `out`.

        CPU `out`: summed straight from the registered buffer. CUDA `out`: the
        peers' parts are copied to the GPU and summed there, with this rank's
        part read from its own device input; summing pinned slots on the CPU and
        copying the result over cost ~3x more from 256 KiB up on an H200
        (benchmarks/arx_staging.py). The copies read the inbox, so step k's slot
        is not reused until they finish (see _retire_copies).
        """
        if not out.is_cuda:
            self._sum_in_order(out, parts)
            return
        nbytes = out.numel() * out.element_size()
        if self._device_parts is None or self._device_parts.device != out.device:
            self._device_parts = torch.empty(self.world, self.L.slot_bytes, dtype=torch.uint8, device=out.device)
        on_gpu = []
        for r, part in enumerate(parts):
            if r == self.rank:
                on_gpu.append(own)
                continue
            dst = self._device_parts[r, :nbytes].view(out.dtype)
            dst.copy_(part, non_blocking=True)
            on_gpu.append(dst)
        ev = torch.cuda.Event()
        ev.record()
        self._copies.append((k, ev))
        self._sum_in_order(out, on_gpu)

    def _sum_in_order(self, target: torch.Tensor, parts: list[torch.Tensor]) -> None:
        torch.add(parts[0], parts[1], out=target) if len(parts) > 1 else target.copy_(parts[0])
        for p in parts[2:]:
            target.add_(p)

    def _send_all(
        self, k: int, src_off: int, nbytes: int, op: str, part_offsets: list[int] | None = None, part_bytes: list[int] | None = None
    ) -> None:
        """Write to every peer's slot for this rank: the same bytes, or (per-peer) part r to rank r."""
        dst = self.L.inbox(k, self.rank)
        for peer in self.t.peers:
            if part_offsets is None:
                self.t.put(k, peer, src_off, dst, nbytes, op)
            else:
                self.t.put(k, peer, src_off + part_offsets[peer], dst, part_bytes[peer], op)

    # ---- CUDA copy-out bookkeeping ---------------------------------------
    def _retire_copies(self, upto_step: int) -> None:
        """Before posting a step, copies still reading slots a peer may now overwrite must finish."""
        while self._copies and self._copies[0][0] <= upto_step:
            self._copies.popleft()[1].synchronize()

    def _copy_out(self, k: int, dst: torch.Tensor, src: torch.Tensor) -> None:
        if not dst.is_cuda:
            dst.copy_(src)
            return
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=dst.device)  # type: ignore[assignment]
        with torch.cuda.stream(self._copy_stream):
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record()
        self._copies.append((k, ev))

    # ---- algorithms -------------------------------------------------------
    def all_reduce_one_shot(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Write the whole input into this rank's slot at every peer; sum locally. One step."""
        nb = inp.numel() * inp.element_size()
        if nb == 0:
            return
        op = "all_reduce"
        k = self._next(op)
        stage = self._view(self.L.staging(k), nb, inp.dtype)
        stage.copy_(inp)
        self._send_all(k, self.L.staging(k), nb, op)
        parts = []
        for r in range(self.world):
            if r != self.rank:
                self.t.wait(k, r, nb, op)
            parts.append(stage if r == self.rank else self._view(self.L.inbox(k, r), nb, inp.dtype))
        self._reduce_into(k, out, parts, own=inp)

    def all_reduce_two_shot(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Reduce-scatter (rank r sums piece r), then all-gather the pieces. Two steps."""
        n, es = inp.numel(), inp.element_size()
        if n == 0:
            return
        op = "all_reduce"
        pieces = split_even(n, self.world)
        offs = [o * es for o, _ in pieces]
        lens = [ln * es for _, ln in pieces]
        me_off, me_len = offs[self.rank], lens[self.rank]
        k = self._next(op)
        self._view(self.L.staging(k), n * es, inp.dtype).copy_(inp)
        self._send_all(k, self.L.staging(k), 0, op, offs, lens)
        parts = []
        for r in range(self.world):
            if r != self.rank:
                self.t.wait(k, r, me_len, op)
                parts.append(self._view(self.L.inbox(k, r), me_len, inp.dtype))
            else:
                parts.append(self._view(self.L.staging(k) + me_off, me_len, inp.dtype))
        k2 = self._next(op)
        mine = self._view(self.L.staging(k2), me_len, inp.dtype)
        if me_len:
            self._sum_in_order(mine, parts)
        self._send_all(k2, self.L.staging(k2), me_len, op)
        target = self._host_target(out, n * es)
        for r in range(self.world):
            lo, ln = pieces[r]
            if r == self.rank:
                src = mine
            else:
                self.t.wait(k2, r, lens[r], op)
                src = self._view(self.L.inbox(k2, r), lens[r], inp.dtype)
            if ln:
                target[lo : lo + ln].copy_(src)
        if target is not out:
            out.copy_(target)

    def reduce_scatter(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Piece r of the input goes to rank r; each rank sums the pieces it got. One step."""
        n, es = out.numel(), out.element_size()
        if n == 0:
            return
        op = "reduce_scatter"
        pb = n * es
        k = self._next(op)
        self._view(self.L.staging(k), self.world * pb, inp.dtype).copy_(inp)
        offs = [r * pb for r in range(self.world)]
        self._send_all(k, self.L.staging(k), 0, op, offs, [pb] * self.world)
        parts = []
        for r in range(self.world):
            if r != self.rank:
                self.t.wait(k, r, pb, op)
                parts.append(self._view(self.L.inbox(k, r), pb, inp.dtype))
            else:
                parts.append(self._view(self.L.staging(k) + offs[r], pb, inp.dtype))
        self._reduce_into(k, out, parts, own=inp[self.rank * n : (self.rank + 1) * n])

    def all_gather(self, inp: torch.Tensor, out: torch.Tensor) -> None:
        """Chunked: one step per chunk of at most `chunk_bytes` per rank, copied out of the
        inbox into `out` as each arrives (asynchronously for CUDA `out`, gated by slot reuse)."""
        pb = inp.numel() * inp.element_size()
        if pb == 0:
            return
        op = "all_gather"
        src_b = inp.view(torch.uint8)
        out_b = out.view(torch.uint8)
        cuda_out = out.is_cuda
        if cuda_out:
            self._wait_for_producers(out)
        out_b[self.rank * pb : (self.rank + 1) * pb].copy_(src_b)
        for off, ln in chunks(pb, self.chunk_bytes):
            k = self._next(op)
            self._view(self.L.staging(k), ln, torch.uint8).copy_(src_b[off : off + ln])
            self._send_all(k, self.L.staging(k), ln, op)
            for r in self.t.peers:
                self.t.wait(k, r, ln, op)
                self._copy_out(k, out_b[r * pb + off : r * pb + off + ln], self._view(self.L.inbox(k, r), ln, torch.uint8))
        if cuda_out:
            torch.cuda.current_stream(out.device).wait_stream(self._copy_stream)

    def _wait_for_producers(self, out: torch.Tensor) -> None:
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=out.device)  # type: ignore[assignment]
        self._copy_stream.wait_stream(torch.cuda.current_stream(out.device))  # type: ignore[attr-defined]

    def close(self) -> None:
        self._retire_copies(self.step)
        self._views.clear()
        self.t.close()
