"""Which RDMA device reaches which peer, decided from facts every rank shares at connect.

The rule: a device serves a peer when its port is up and the peer has a device, up too, with an
IPv4 address in the same subnet (the address a RoCE v2 GID carries; the prefix is the netdev's).
Between two ranks the devices are paired one to one, subnet by subnet; each pair is a *link*, one
RC queue pair, and a write to that peer stripes over its links. The same rule covers every cabling:
Spark twins (one subnet or one each) give two links to a peer; on a ring of three each neighbour is
reached through one port's twins; on a switch every device reaches every peer. Queue pairs are
opened on links only. Two ranks without a link are one error, raised alike on every rank before any
collective (every rank computes it from the same facts), naming both ranks and their subnets.

Loopback addresses link only ranks on one kernel (same boot id); one address on two hosts is no
link. What addresses cannot show: one subnet across every port of a ring (link-local 169.254/16 on
each cable) looks like a switch, so each cable needs its own subnet.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass, field

from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.device import DeviceInfo, boot_id, ipv4_addresses, named_devices, read_devices
from arxtune.runtime.rdma.errors import RdmaUnavailable


class Unreachable(RdmaUnavailable):
    """Two ranks share no subnet on a working device: no queue pair can join them."""


@dataclass(frozen=True)
class Address:
    """One IPv4 address of a device's netdev and the RoCE v2 GID that carries it."""

    ip: str
    prefix: int
    gid_index: int
    gid: str

    @property
    def network(self) -> ipaddress.IPv4Network:
        return ipaddress.IPv4Network(f"{self.ip}/{self.prefix}", strict=False)

    @property
    def loopback(self) -> bool:
        return ipaddress.IPv4Address(self.ip).is_loopback

    def __str__(self) -> str:
        return f"{self.ip}/{self.prefix}"


@dataclass(frozen=True)
class DeviceFacts:
    name: str
    state: str  # the port's state: "ACTIVE", "DOWN", ...
    addresses: tuple[Address, ...] = ()

    @property
    def up(self) -> bool:
        return self.state == "ACTIVE"

    def __str__(self) -> str:
        where = "+".join(map(str, self.addresses)) or "no IPv4 address"
        return f"{self.name} {where}" + ("" if self.up else f" ({self.state})")


@dataclass(frozen=True)
class RankFacts:
    """What one rank tells the others at connect: its candidate devices, and which kernel it runs on."""

    rank: int
    host: str  # hostname, for people
    boot: str  # kernel boot id: equal on ranks that share a host
    devices: tuple[DeviceFacts, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        return f"rank {self.rank} ({self.host}) has " + (", ".join(map(str, self.devices)) or "no RDMA device")


@dataclass(frozen=True)
class Link:
    """One queue pair's path to a peer, seen from this rank: local device and GID, the peer's device and GID."""

    local: str
    remote: str
    sgid_index: int
    dgid: str
    subnet: str


# ---- facts of this rank ----------------------------------------------------------------
def local_facts(
    cfg: RdmaConfig,
    rank: int,
    devices: list[DeviceInfo] | None = None,
    addresses: dict[str, tuple[tuple[str, int], ...]] | None = None,
    boot: str | None = None,
    host: str | None = None,
) -> RankFacts:
    """This rank's candidate devices: those `cfg` names, else every device with an Ethernet port `cfg.port`,
    each with its port state and the IPv4 addresses (with prefix) its RoCE v2 GIDs carry.
    Arguments left None are read here (sysfs, rtnetlink, the boot id)."""
    devices = read_devices() if devices is None else devices
    chosen = named_devices(cfg, devices)
    if chosen is None:
        chosen = [d for d in devices if (p := d.port(cfg.port)) is not None and p.link_layer == "Ethernet"]
        if not chosen:
            raise RdmaUnavailable(
                f"arx: no RDMA device has an Ethernet (RoCE) port {cfg.port}: "
                f"{', '.join(sorted(d.name for d in devices))}; set ARXTUNE_RDMA_PORT or ARXTUNE_RDMA_DEVICES"
            )
    if addresses is None:
        try:
            addresses = ipv4_addresses()
        except OSError as exc:
            raise RdmaUnavailable(f"arx: cannot read the netdevs' IPv4 addresses over rtnetlink: {exc}") from exc
    facts = tuple(_device_facts(dev, cfg, addresses) for dev in chosen)
    return RankFacts(rank, host or socket.gethostname(), boot or boot_id(), facts)


def _device_facts(dev: DeviceInfo, cfg: RdmaConfig, addresses: dict[str, tuple[tuple[str, int], ...]]) -> DeviceFacts:
    port = dev.port(cfg.port)
    if port is None:
        raise RdmaUnavailable(f"arx: {dev.name} has no port {cfg.port}")
    if port.link_layer != "Ethernet":
        raise RdmaUnavailable(f"arx: {dev.name} port {cfg.port} is {port.link_layer}, not Ethernet (RoCE v2)")
    gids = [g for g in port.gids if g.roce_v2 and g.ipv4]
    if cfg.gid_index is not None:
        entry = next((g for g in port.gids if g.index == cfg.gid_index), None)
        if entry is None or not entry.roce_v2 or not entry.ipv4:
            what = "no GID" if entry is None else f"{entry.gid_type} GID {entry.gid}"
            raise RdmaUnavailable(
                f"arx: {dev.name} port {cfg.port} has {what} at index {cfg.gid_index}; arx needs a RoCE v2 "
                f"GID that carries an IPv4 address there (ARXTUNE_RDMA_GID_INDEX / gid_index)"
            )
        gids = [entry]
    found: dict[str, Address] = {}
    for g in gids:
        prefix = next((p for ip, p in addresses.get(g.netdev or "", ()) if ip == g.ipv4), None)
        if prefix is not None and g.ipv4 not in found:  # a GID whose address left the netdev is stale
            found[g.ipv4] = Address(g.ipv4, prefix, g.index, g.gid)
    ordered = sorted(found.values(), key=lambda a: (a.loopback, a.gid_index))  # routable addresses first
    return DeviceFacts(dev.name, port.state, tuple(ordered))


# ---- the rule ------------------------------------------------------------------------------
def _joins(x: Address, y: Address, same_host: bool) -> bool:
    """Whether addresses x and y (of two ranks) are in one subnet a packet can cross between them."""
    if (x.loopback or y.loopback or x.ip == y.ip) and not same_host:
        return False
    return ipaddress.IPv4Address(y.ip) in x.network and ipaddress.IPv4Address(x.ip) in y.network


def pair_links(a: RankFacts, b: RankFacts) -> list[tuple[int, Address, int, Address]]:
    """The links between ranks a and b as (a's device index, its address, b's device index, its address).

    Each device is in at most one link; a's devices in order take the first free device of b they
    join (so identical device lists on one host pair each device with itself), and a device that
    finds none free takes one over from a device that has another choice (a matching as large
    as can be). Pass the lower rank first: both ranks then compute the same links in the same order."""
    same_host = a.boot == b.boot
    options = [
        [(j, x, y) for x in da.addresses for j, db in enumerate(b.devices) if db.up for y in db.addresses if _joins(x, y, same_host)]
        if da.up
        else []
        for da in a.devices
    ]
    owner: dict[int, tuple[int, Address, Address]] = {}  # b's device -> (a's device, a's address, b's address)

    def place(i: int, seen: set[int]) -> bool:
        for j, x, y in options[i]:  # a free device of b first
            if j not in owner:
                owner[j] = (i, x, y)
                return True
        for j, x, y in options[i]:  # else move the current holder to another of its choices
            if j not in seen:
                seen.add(j)
                if place(owner[j][0], seen):
                    owner[j] = (i, x, y)
                    return True
        return False

    for i in range(len(a.devices)):
        place(i, set())
    return sorted(((i, x, j, y) for j, (i, x, y) in owner.items()), key=lambda link: (link[0], link[2]))


def _pairs(group: list[RankFacts]) -> dict[tuple[int, int], list[tuple[int, Address, int, Address]]]:
    return {(a, b): pair_links(group[a], group[b]) for a in range(len(group)) for b in range(a + 1, len(group))}


def check(group: list[RankFacts], width: int | None = None) -> dict[tuple[int, int], list]:
    """The links of every pair of ranks (lower rank first); raises Unreachable naming every pair without one,
    and, where `width` links per peer are needed, RdmaUnavailable for a pair with fewer."""
    for r, facts in enumerate(group):
        if facts.rank != r:
            raise ValueError(f"facts of rank {facts.rank} at position {r}: pass them in rank order")
    pairs = _pairs(group)
    cut = [(a, b) for (a, b), links in pairs.items() if not links]
    if cut:
        named = sorted({r for pair in cut for r in pair})
        raise Unreachable(
            f"arx: no RDMA link between {', '.join(f'rank {a} and rank {b}' for a, b in cut)}: no working device of one is in "
            f"a subnet of the other's ({'; '.join(str(group[r]) for r in named)}). Cable a port of each into one subnet, "
            f"bring its link up, or set ARXTUNE_RDMA_DEVICES to devices that reach every peer"
        )
    if width is not None:
        short = [(a, b, len(links)) for (a, b), links in pairs.items() if len(links) < width]
        if short:
            a, b, n = short[0]
            raise RdmaUnavailable(
                f"arx: rank {a} and rank {b} share {n} RDMA link(s) but every peer needs {width} "
                f"(the links changed during set-up?): {group[a]}; {group[b]}"
            )
    return pairs


def routes(group: list[RankFacts], rank: int, width: int | None = None) -> dict[int, tuple[Link, ...]]:
    """This rank's links to every peer, in stripe order (at most `width` each). Raises as check() does, on every rank alike."""
    pairs = check(group, width)
    out = {}
    for peer in range(len(group)):
        if peer == rank:
            continue
        lo, hi = min(rank, peer), max(rank, peer)
        links = []
        for i, x, j, y in pairs[(lo, hi)]:
            if rank == hi:
                i, x, j, y = j, y, i, x
            links.append(Link(group[rank].devices[i].name, group[peer].devices[j].name, x.gid_index, y.gid, str(x.network)))
        out[peer] = tuple(links[:width] if width else links)
    return out


def narrowest(group: list[RankFacts]) -> int:
    """The fewest links any pair of ranks has (>= 1, or Unreachable): what every peer can be striped over."""
    return min((len(links) for links in check(group).values()), default=1)


def widest(group: list[RankFacts]) -> int:
    """The most links any pair of ranks has (>= 1, or Unreachable): the flag words a receiver keeps per peer."""
    return max((len(links) for links in check(group).values()), default=1)


# ---- the matrix, for people ----------------------------------------------------------------
def matrix(group: list[RankFacts]) -> list[list[str]]:
    """Rows of the reachability matrix, header first: per rank its devices, then per peer the devices
    of this rank that reach it ("-" none, "self" on the diagonal). Needs no links to exist."""
    pairs = _pairs(group)
    rows = [["rank", "host", "devices", *(f"to {p}" for p in range(len(group)))]]
    for r, facts in enumerate(group):
        cells = []
        for p in range(len(group)):
            if p == r:
                cells.append("self")
                continue
            links = pairs[(min(r, p), max(r, p))]
            mine = [group[r].devices[i if r < p else j].name for i, _, j, _ in links]
            cells.append("+".join(mine) or "-")
        rows.append([str(r), facts.host, ", ".join(map(str, facts.devices)) or "none", *cells])
    return rows


def render(group: list[RankFacts]) -> str:
    """The matrix as aligned text, one line per rank."""
    rows = matrix(group)
    widths = [max(len(row[c]) for row in rows) for c in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows)
