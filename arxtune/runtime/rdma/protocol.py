"""Buffer layout, step/slot/sequence rules and the plans that split messages.

All of it is pure arithmetic, shared by every rank: since each rank derives the
same plan from the same sizes, no plan ever travels on the wire.

The flag protocol. Every collective is a series of *steps*; in step k each rank
writes a payload into its own region of slot ``k % slots`` at each peer, then, on
the same RC queue pair (RC executes writes in order), the 8-byte sequence number
``k + 1`` into its flag word there. A receiver polls the flag words of slot
``k % slots`` until they equal ``k + 1``. Why no barrier is needed: a peer can
only write step k + slots - 1 into slot (k - 1) % slots after it has seen our step
k + slots - 2, and we post a step only after we finished reading every slot we
will not read again — so ``slots = 2`` suffices when each step is read before the
next is posted, and a third slot lets a step be read while the next is in flight.
Which memory order each hand-off relies on (GPU, proxy, NICs; x86-64 and
aarch64): docs/arxg-ordering.md.
"""

from __future__ import annotations

from dataclasses import dataclass

ALIGN = 64  #: region alignment: a cache line, and a multiple of every element size
FLAG_BYTES = 8


def align_up(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def seq_of(step: int) -> int:
    """The value that marks step `step` complete; never 0, which is fresh memory."""
    return step + 1


@dataclass(frozen=True)
class Layout:
    """Offsets into the one registered buffer of a rank.

    ``[staging: slots x slot_bytes][flag sources: slots x 8]`` is what this rank sends
    from; ``[inbox: slots x world x slot_bytes][flags: slots x world x ndev x 8]`` is
    what peers write into. One buffer means one registration per device.
    """

    world: int
    slots: int
    slot_bytes: int
    ndev: int = 1

    def __post_init__(self):
        if self.slot_bytes % ALIGN:
            raise ValueError(f"slot_bytes must be a multiple of {ALIGN}")

    def slot(self, step: int) -> int:
        return step % self.slots

    def staging(self, step: int) -> int:
        return self.slot(step) * self.slot_bytes

    def flag_source(self, step: int) -> int:
        return self.slots * self.slot_bytes + self.slot(step) * FLAG_BYTES

    @property
    def inbox_base(self) -> int:
        return align_up(self.slots * self.slot_bytes + self.slots * FLAG_BYTES)

    def inbox(self, step: int, src: int) -> int:
        return self.inbox_base + (self.slot(step) * self.world + src) * self.slot_bytes

    @property
    def flags_base(self) -> int:
        return self.inbox_base + self.slots * self.world * self.slot_bytes

    def flag_index(self, step: int, src: int, dev: int) -> int:
        """Index of a flag word in the int64 view that starts at `flags_base`."""
        return (self.slot(step) * self.world + src) * self.ndev + dev

    def flag(self, step: int, src: int, dev: int) -> int:
        return self.flags_base + self.flag_index(step, src, dev) * FLAG_BYTES

    @property
    def num_flags(self) -> int:
        return self.slots * self.world * self.ndev

    @property
    def total_bytes(self) -> int:
        return self.flags_base + self.num_flags * FLAG_BYTES


def split_even(n: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of `parts` contiguous pieces of n items, lengths differing by at most 1.

    Two-shot all-reduce gives piece r to rank r to reduce."""
    base, extra = divmod(n, parts)
    out, off = [], 0
    for r in range(parts):
        length = base + (1 if r < extra else 0)
        out.append((off, length))
        off += length
    return out


def stripes(nbytes: int, ndev: int, min_bytes: int) -> list[tuple[int, int, int]]:
    """(device, offset, length) pieces of a write: one device below `min_bytes`,
    else ALIGN-aligned near-equal pieces on every device. Empty pieces are dropped,
    and the receiver waits only for the devices listed here."""
    if ndev == 1 or nbytes < max(min_bytes, 1):
        return [(0, 0, nbytes)]
    units = (nbytes + ALIGN - 1) // ALIGN
    pieces = []
    for dev, (off, length) in enumerate(split_even(units, ndev)):
        start, stop = off * ALIGN, min((off + length) * ALIGN, nbytes)
        if stop > start:
            pieces.append((dev, start, stop - start))
    return pieces


def chunks(nbytes: int, chunk_bytes: int) -> list[tuple[int, int]]:
    """(offset, length) pieces of at most `chunk_bytes`; at least one piece, even for 0 bytes."""
    if nbytes <= chunk_bytes:
        return [(0, nbytes)]
    return [(off, min(chunk_bytes, nbytes - off)) for off in range(0, nbytes, chunk_bytes)]
