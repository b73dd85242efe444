"""Finding RDMA devices, ports and the RoCE v2 GID to use, from sysfs.

Discovery reads /sys/class/infiniband (plain files, no pyverbs), so `arxtune
doctor` works where pyverbs is missing and the selection logic is testable on a
fake tree. The rule: the RoCE v2 GID whose address is the netdev's IPv4 address
(an IPv4-mapped GID, ::ffff:a.b.c.d), since that is what routes across nodes.
"""

from __future__ import annotations

import ipaddress
import os
import resource
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.errors import RdmaUnavailable

SYSFS_ROOT = Path("/sys/class/infiniband")
NET_ROOT = Path("/sys/class/net")
ROCE_V2 = "RoCE v2"


@dataclass(frozen=True)
class GidEntry:
    index: int
    gid: str  # 8 groups of 4 hex digits, as sysfs and pyverbs write it
    gid_type: str  # "RoCE v2" or "IB/RoCE v1"
    netdev: str | None

    @property
    def ipv4(self) -> str | None:
        """The IPv4 address this GID carries, if it is IPv4-mapped."""
        mapped = ipaddress.IPv6Address(self.gid).ipv4_mapped
        return str(mapped) if mapped else None

    @property
    def roce_v2(self) -> bool:
        return self.gid_type == ROCE_V2


@dataclass(frozen=True)
class PortInfo:
    device: str
    port: int
    state: str  # "ACTIVE", "DOWN", ...
    link_layer: str  # "Ethernet" for RoCE
    gids: tuple[GidEntry, ...]

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"

    @property
    def netdevs(self) -> tuple[str, ...]:
        return tuple(sorted({g.netdev for g in self.gids if g.netdev}))


@dataclass(frozen=True)
class DeviceInfo:
    name: str
    ports: tuple[PortInfo, ...]

    def port(self, num: int) -> PortInfo | None:
        return next((p for p in self.ports if p.port == num), None)


@dataclass(frozen=True)
class Endpoint:
    """The (device, port, GID) one QP family uses; what `select_endpoints` returns."""

    device: str
    port: int
    gid: GidEntry


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # empty GID slots fail with EINVAL; missing files with ENOENT
        return None


def read_port(dev_dir: Path, port: int) -> PortInfo:
    pdir = dev_dir / "ports" / str(port)
    state = (_read(pdir / "state") or "?").split(":")[-1].strip()
    gids = []
    gid_dir = pdir / "gids"
    for name in sorted(os.listdir(gid_dir), key=int) if gid_dir.is_dir() else ():
        gid = _read(gid_dir / name)
        if not gid or int(gid.replace(":", ""), 16) == 0:
            continue
        gid_type = _read(pdir / "gid_attrs" / "types" / name)
        if gid_type is None:
            continue
        netdev = _read(pdir / "gid_attrs" / "ndevs" / name)
        gids.append(GidEntry(int(name), gid, gid_type, netdev or None))
    return PortInfo(dev_dir.name, port, state, _read(pdir / "link_layer") or "?", tuple(gids))


def read_devices(root: Path | str = SYSFS_ROOT) -> list[DeviceInfo]:
    """All RDMA devices under `root` (sysfs layout), sorted by name; [] when there is none."""
    root = Path(root)
    if not root.is_dir():
        return []
    devices = []
    for dev_dir in sorted(root.iterdir()):
        ports_dir = dev_dir / "ports"
        nums = sorted(int(p) for p in os.listdir(ports_dir)) if ports_dir.is_dir() else []
        devices.append(DeviceInfo(dev_dir.name, tuple(read_port(dev_dir, n) for n in nums)))
    return devices


def select_gid(port: PortInfo, gid_index: int | None = None) -> GidEntry:
    """The GID to use on `port`: `gid_index` if given (must be RoCE v2), else the
    RoCE v2 IPv4-mapped GID, preferring a routable address over loopback."""
    where = f"{port.device} port {port.port}"
    if gid_index is not None:
        entry = next((g for g in port.gids if g.index == gid_index), None)
        if entry is None:
            raise RdmaUnavailable(f"arx: {where} has no GID at index {gid_index} (ARXTUNE_RDMA_GID_INDEX / gid_index)")
        if not entry.roce_v2:
            raise RdmaUnavailable(f"arx: GID {gid_index} on {where} is {entry.gid_type}, not RoCE v2")
        return entry
    candidates = [g for g in port.gids if g.roce_v2 and g.ipv4]
    if not candidates:
        kinds = ", ".join(sorted({g.gid_type for g in port.gids})) or "no GIDs at all"
        raise RdmaUnavailable(
            f"arx: no RoCE v2 GID with an IPv4 address on {where} ({kinds}); give its netdev "
            f"({', '.join(port.netdevs) or 'none'}) an IPv4 address or set ARXTUNE_RDMA_GID_INDEX"
        )
    routable = [g for g in candidates if not ipaddress.IPv4Address(g.ipv4).is_loopback]
    return (routable or candidates)[0]


def named_devices(cfg: RdmaConfig, devices: list[DeviceInfo]) -> list[DeviceInfo] | None:
    """The devices `cfg` names, in its order (None when it names none); raises when there are no devices
    at all or a named one is missing."""
    if not devices:
        raise RdmaUnavailable("arx: no RDMA devices (/sys/class/infiniband is empty; load rdma_rxe or a NIC driver)")
    if not cfg.devices:
        return None
    by_name = {d.name: d for d in devices}
    missing = [n for n in cfg.devices if n not in by_name]
    if missing:
        raise RdmaUnavailable(f"arx: RDMA device(s) {', '.join(missing)} not found; present: {', '.join(by_name)}")
    return [by_name[n] for n in cfg.devices]


def select_endpoints(cfg: RdmaConfig, devices: list[DeviceInfo]) -> list[Endpoint]:
    """The devices to use: those named in `cfg`, or else the first usable one."""
    named = named_devices(cfg, devices)
    if named is not None:
        return [_endpoint(dev, cfg) for dev in named]
    reasons = []
    for dev in devices:
        try:
            return [_endpoint(dev, cfg)]
        except RdmaUnavailable as exc:
            reasons.append(str(exc))
    raise RdmaUnavailable("; ".join(reasons))


def _endpoint(dev: DeviceInfo, cfg: RdmaConfig) -> Endpoint:
    port = dev.port(cfg.port)
    if port is None:
        raise RdmaUnavailable(f"arx: {dev.name} has no port {cfg.port}")
    if port.link_layer != "Ethernet":
        raise RdmaUnavailable(f"arx: {dev.name} port {cfg.port} is {port.link_layer}, not Ethernet (RoCE v2)")
    if not port.active:
        raise RdmaUnavailable(f"arx: {dev.name} port {cfg.port} is {port.state}, not ACTIVE")
    return Endpoint(dev.name, cfg.port, select_gid(port, cfg.gid_index))


def netdev_mtu(netdev: str, root: Path | str = NET_ROOT) -> int | None:
    value = _read(Path(root) / netdev / "mtu")
    return int(value) if value else None


# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_addr.h): fixed kernel ABI
_RTM_NEWADDR, _RTM_GETADDR, _NLM_F_REQUEST, _NLM_F_DUMP, _NLMSG_ERROR, _NLMSG_DONE = 20, 22, 0x1, 0x300, 2, 3
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_NLMSG, _IFADDR, _RTATTR = struct.Struct("=IHHII"), struct.Struct("=BBBBI"), struct.Struct("=HH")


def parse_address_dump(data: bytes) -> tuple[list[tuple[int, str, int]], bool]:
    """([(interface index, IPv4 address, prefix length), ...], whether the dump ended) of RTM_NEWADDR messages."""
    out, off, done = [], 0, False
    while off + _NLMSG.size <= len(data):
        length, kind, _, _, _ = _NLMSG.unpack_from(data, off)
        if length < _NLMSG.size:
            break
        if kind == _NLMSG_DONE:
            done = True
        elif kind == _NLMSG_ERROR:
            code = -struct.unpack_from("=i", data, off + _NLMSG.size)[0]
            raise OSError(code, f"netlink: {os.strerror(code)}")
        elif kind == _RTM_NEWADDR:
            family, prefix, _, _, index = _IFADDR.unpack_from(data, off + _NLMSG.size)
            found: dict[int, bytes] = {}
            at = off + _NLMSG.size + _IFADDR.size
            while at + _RTATTR.size <= off + length:
                alen, atype = _RTATTR.unpack_from(data, at)
                if alen < _RTATTR.size:
                    break
                found[atype] = data[at + _RTATTR.size : at + alen]
                at += (alen + 3) & ~3
            # IFA_LOCAL is the interface's own address; IFA_ADDRESS is the peer's on point-to-point links
            raw = found.get(_IFA_LOCAL) or found.get(_IFA_ADDRESS)
            if family == socket.AF_INET and raw and len(raw) == 4:
                out.append((index, socket.inet_ntoa(raw), prefix))
        off += (length + 3) & ~3
    return out, done


def ipv4_addresses(timeout_s: float = 2.0) -> dict[str, tuple[tuple[str, int], ...]]:
    """Every netdev's IPv4 addresses with their prefix lengths, asked of the kernel over rtnetlink
    (sysfs has no addresses; `ip` may be missing). Several addresses on one netdev are all listed."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE) as sock:
        sock.settimeout(timeout_s)
        sock.bind((0, 0))
        request = _NLMSG.pack(_NLMSG.size + _IFADDR.size, _RTM_GETADDR, _NLM_F_REQUEST | _NLM_F_DUMP, 1, 0)
        sock.send(request + _IFADDR.pack(socket.AF_INET, 0, 0, 0, 0))
        found: list[tuple[int, str, int]] = []
        done = False
        while not done:
            part, done = parse_address_dump(sock.recv(1 << 16))
            found += part
    names = dict(socket.if_nameindex())
    out: dict[str, list[tuple[str, int]]] = {}
    for index, ip, prefix in found:
        out.setdefault(names.get(index, f"if{index}"), []).append((ip, prefix))
    return {name: tuple(addrs) for name, addrs in out.items()}


def boot_id() -> str:
    """This kernel's boot id: two ranks with the same one share a host (and its loopback addresses)."""
    return _read(Path("/proc/sys/kernel/random/boot_id")) or socket.gethostname()


def memlock_limit() -> int | None:
    """RLIMIT_MEMLOCK soft limit in bytes (ulimit -l), None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


def check_memlock(need: int) -> None:
    """Raise if registering `need` bytes would exceed ulimit -l (root bypasses it via CAP_IPC_LOCK)."""
    limit = memlock_limit()
    if limit is not None and limit < need and os.geteuid() != 0:
        raise RdmaUnavailable(
            f"arx: ulimit -l is {limit} bytes but the buffers need {need}; raise it "
            f"(ulimit -l unlimited, or memlock in /etc/security/limits.conf) or lower ARXTUNE_RDMA_MAX_BYTES"
        )
