"""The shared-memory segment of one rank: a control block, then the protocol buffer.

The file lives in /dev/shm and is mapped by the rank (GPU or CPU side) and by
its proxy; with the shared-memory fabric, the peers' proxies map it too and
write into its inbox. Control words (int64, each group on its own cache line):

- DOORBELL: the sequence number of the last step the rank has begun to stage
  (part 0's bell).
- DESC + 2*slot: (op code, bytes) of the step staged in that slot.
- PARTS + slot: how many parts (GPU programs) staged that step; part p >= 1
  rings its own bell, BELLS + p, once its share is staged, so no part waits
  for another before the proxy may send (0 or 1: the doorbell alone).
- SENT: the sequence number of the last step whose writes completed: its staging
  slot may be reused.
- ERROR, ERROR_PEER, ERROR_SEQ: the first failure (a code below), with whom, at
  which step; a message from the proxy at MESSAGE.
- READY: the proxy's pid once it serves doorbells.
- HEARTBEAT: CLOCK_MONOTONIC nanoseconds at the proxy's last sign of life (it
  stores the time while it waits and after the steps it sends): a rank reads
  liveness here instead of asking the kernel about the process on every call.
- ASLEEP, WAKE (32-bit, the low half of their words): ASLEEP is 1 while the
  proxy blocks in a futex wait on WAKE (its wait policy, arxg_wait.h); an eager
  call then bumps WAKE and wakes it before launching (cuda_launch.c).
"""

from __future__ import annotations

import mmap
import os

import numpy as np
import torch

from arxtune.runtime.rdma.protocol import Layout

CONTROL_BYTES = 4096
DOORBELL, DESC, PARTS, SENT, ERROR, ERROR_PEER, ERROR_SEQ, READY, HEARTBEAT = 0, 8, 12, 16, 24, 25, 26, 32, 40
ASLEEP, WAKE = 48, 56
MESSAGE, MESSAGE_BYTES = 1024, 1024  # bytes
BELLS, MAX_PARTS = 256, 256  # words: the parts' bells fill the control block's second half

#: op codes in the descriptor and the kernels
OP_CODES = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2, "handshake": 3}
OP_NAMES = {code: name for name, code in OP_CODES.items()}

#: error codes
ERR_PEER_TIMEOUT = 1  # a peer's flag did not arrive in time
ERR_PROXY_TIMEOUT = 2  # this rank's proxy did not send a step in time
ERR_PROXY_FAILED = 3  # the proxy hit an error (message in MESSAGE)


class Segment:
    """One rank's mapped segment; `create=True` makes the file (the rank does), else maps it."""

    def __init__(self, path: str, layout: Layout, create: bool = False):
        self.path, self.layout, self.owner = path, layout, create
        self.size = CONTROL_BYTES + layout.total_bytes
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, self.size)
            elif os.fstat(fd).st_size != self.size:
                raise ValueError(
                    f"segment {path} has {os.fstat(fd).st_size} bytes, expected {self.size} (ranks disagree on world size or max_bytes)"
                )
            self._mm = mmap.mmap(fd, self.size)
        finally:
            os.close(fd)
        self.bytes = np.frombuffer(self._mm, dtype=np.uint8)
        self.control = self.bytes[:CONTROL_BYTES].view(np.int64)
        self.data = self.bytes[CONTROL_BYTES:]  # the protocol buffer, offsets as in Layout
        self.flags = self.data[layout.flags_base : layout.total_bytes].view(np.int64)
        self.address = self.bytes.ctypes.data
        self.data_address = self.address + CONTROL_BYTES  # where `data` (protocol offsets) starts

    def data_tensor(self) -> torch.Tensor:
        """The protocol buffer as a CPU uint8 tensor sharing this memory (what the transports take)."""
        return torch.from_numpy(self.data)

    def typed(self, offset: int, count: int, dtype: torch.dtype) -> torch.Tensor:
        """`count` items of `dtype` at byte `offset` of the protocol buffer, as a CPU tensor view."""
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        return self.data_tensor()[offset : offset + nbytes].view(dtype)

    def touch(self) -> None:
        """Read one byte of every page, so each is mapped before a device reads it through the page tables."""
        int(self.bytes[:: mmap.PAGESIZE].max())

    # ---- control words --------------------------------------------------------
    def set_error(self, code: int, peer: int = -1, seq: int = 0, message: str = "") -> None:
        """Record the first failure only; later ones are consequences of it."""
        if self.control[ERROR]:
            return
        raw = message.encode()[: MESSAGE_BYTES - 1]
        self.bytes[MESSAGE : MESSAGE + MESSAGE_BYTES] = 0
        self.bytes[MESSAGE : MESSAGE + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        self.control[ERROR_PEER], self.control[ERROR_SEQ] = peer, seq
        self.control[ERROR] = code

    def error(self) -> tuple[int, int, int, str]:
        """(code, peer, seq, message); code 0 = no failure."""
        raw = bytes(self.bytes[MESSAGE : MESSAGE + MESSAGE_BYTES]).split(b"\0", 1)[0]
        return int(self.control[ERROR]), int(self.control[ERROR_PEER]), int(self.control[ERROR_SEQ]), raw.decode(errors="replace")

    def close(self) -> None:
        """Unmap (when no view is left) and remove the file if this side created it."""
        self.bytes = self.control = self.data = self.flags = None
        try:
            self._mm.close()
        except BufferError:  # a tensor still views the memory: the mapping goes with it
            pass
        if self.owner:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass


def segment_path(token: str, rank: int) -> str:
    return f"/dev/shm/arxg-{token}-{rank}"
