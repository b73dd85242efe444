"""RDMA errors that name what failed, where, and with whom.

Every failure in the transport becomes one of these within a timeout, so a
caller never hangs and the message alone is enough to find the broken link.
"""

from __future__ import annotations

from arxtune.runtime.errors import ArxtuneError


class RdmaError(ArxtuneError):
    """A transport failure: a bad work completion, a queue pair in error, a set-up step."""

    def __init__(self, message: str, *, device: str | None = None, peer: int | None = None, op: str | None = None):
        where = ", ".join(
            part
            for part in (
                f"op {op}" if op else "",
                f"device {device}" if device else "",
                f"peer rank {peer}" if peer is not None else "",
            )
            if part
        )
        super().__init__(f"{message} ({where})" if where else message)
        self.device = device
        self.peer = peer
        self.op = op


class RdmaTimeout(RdmaError):
    """A peer did not deliver within the timeout: it stopped, crashed or never connected."""


class RdmaUnavailable(ArxtuneError):
    """RDMA cannot run here at all (no pyverbs, no device, no RoCE v2 GID, memlock too low)."""
