"""An in-process stand-in for the RDMA transport, to test the algorithms and the
slot protocol without a device.

Like RC: writes between one pair of ranks land in order, late (a "wire" thread
delivers them after a random delay), and read their source bytes only when they
land — so an algorithm that reuses a staging slot or an inbox slot too early
gets wrong answers here, as it would on a NIC.
"""

from __future__ import annotations

import queue
import random
import threading
import time

import torch

from arxtune.runtime.rdma.errors import RdmaTimeout
from arxtune.runtime.rdma.protocol import Layout, seq_of


class FakeFabric:
    def __init__(self, world: int, slot_bytes: int, slots: int = 2, max_delay_s: float = 0.0, seed: int = 0):
        self.layout = Layout(world=world, slots=slots, slot_bytes=slot_bytes, ndev=1)
        self.bufs = [torch.zeros(self.layout.total_bytes, dtype=torch.uint8) for _ in range(world)]
        self.max_delay_s = max_delay_s
        self.rng = random.Random(seed)
        self.wire: queue.Queue = queue.Queue()
        self.delivered: dict[int, int] = {r: -1 for r in range(world)}  # rank -> last step fully delivered
        self.cv = threading.Condition()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def transports(self, timeout_s: float = 10.0) -> list["FakeTransport"]:
        return [FakeTransport(self, r, timeout_s) for r in range(self.layout.world)]

    def _run(self):
        while True:
            item = self.wire.get()
            if item is None:
                return
            src, dst, step, src_off, dst_off, nbytes, last = item
            if self.max_delay_s:
                time.sleep(self.rng.random() * self.max_delay_s)
            L = self.layout
            self.bufs[dst][dst_off : dst_off + nbytes].copy_(self.bufs[src][src_off : src_off + nbytes])
            flag = self.bufs[dst][L.flag(step, src, 0) : L.flag(step, src, 0) + 8].view(torch.int64)
            flag.fill_(int(self.bufs[src][L.flag_source(step) : L.flag_source(step) + 8].view(torch.int64)))
            if last:
                with self.cv:
                    self.delivered[src] = step
                    self.cv.notify_all()

    def stop(self):
        self.wire.put(None)
        self.thread.join()


class FakeTransport:
    def __init__(self, fabric: FakeFabric, rank: int, timeout_s: float):
        self.fabric, self.rank, self.timeout_s = fabric, rank, timeout_s
        self.layout = fabric.layout
        self.world = self.layout.world
        self.peers = [(rank + i) % self.world for i in range(1, self.world)]
        self.buf = fabric.bufs[rank]
        self._pending: list = []
        self.closed = False

    def begin(self, step: int, op: str) -> None:
        # staging / flag source of `step` are reused from step - slots: wait for those writes to land
        want = step - self.layout.slots
        with self.fabric.cv:
            self.fabric.cv.wait_for(lambda: self.fabric.delivered[self.rank] >= want, timeout=self.timeout_s)
        L = self.layout
        self.buf[L.flag_source(step) : L.flag_source(step) + 8].view(torch.int64).fill_(seq_of(step))

    def put(self, step: int, peer: int, src_off: int, dst_off: int, nbytes: int, op: str) -> None:
        last = peer == self.peers[-1]
        self.fabric.wire.put((self.rank, peer, step, src_off, dst_off, nbytes, last))

    def wait(self, step: int, src: int, nbytes: int, op: str) -> None:
        L = self.layout
        flag = self.buf[L.flag(step, src, 0) : L.flag(step, src, 0) + 8].view(torch.int64)
        deadline = time.monotonic() + self.timeout_s
        while int(flag) != seq_of(step):
            if time.monotonic() > deadline:
                raise RdmaTimeout(f"fake: rank {src} sent nothing for step {step}", peer=src, op=op)
            time.sleep(0)

    def close(self) -> None:
        self.closed = True
