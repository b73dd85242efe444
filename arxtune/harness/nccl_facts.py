"""What NCCL is here and what it did: its library files, its own log, and the settings a pair needs.

- `library_info`: a libnccl file's version (the "NCCL version X+cudaY" string every build
  carries) and its GNU build id, read from the file without loading it: one version number
  can be two different builds (the pip wheel and the OS package of 2.28.9 behaved apart).
- `parse_log`: NCCL's `NCCL_DEBUG=INFO` output, as the sweep has each rank write it
  (NCCL_DEBUG_FILE): which network (IB or Socket), which HCAs and ports, the GID index,
  how many channels, what each channel went over, and where NCCL prints them, the
  algorithm and protocol it chose per size.
- `pair_settings`: NCCL_IB_HCA, NCCL_IB_GID_INDEX and NCCL_SOCKET_IFNAME from this box's RDMA
  devices, as `arxtune doctor` prints them and the GB10 sweep config sets them when unset.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path

#: NCCL before this hangs on ARM hosts after tens of minutes of TP=2 (its release notes; FIELD-NOTES 11).
ARM_HANG_FIXED = (2, 29, 3)
_VERSION = re.compile(rb"NCCL version (\d+)\.(\d+)\.(\d+)([^\x00\s]*)")


@dataclass(frozen=True)
class NcclLibrary:
    path: str
    version: str | None  # "2.28.9+cuda13.0"
    build_id: str | None  # hex, from the ELF's NT_GNU_BUILD_ID note

    @property
    def numbers(self) -> tuple[int, int, int] | None:
        match = re.match(r"(\d+)\.(\d+)\.(\d+)", self.version or "")
        return tuple(map(int, match.groups())) if match else None  # type: ignore[return-value]

    def describe(self) -> str:
        return f"{self.path} (version {self.version or 'unknown'}, build {self.build_id[:16] if self.build_id else 'unknown'})"


def library_info(path: Path | str) -> NcclLibrary:
    """Version and build id of a libnccl file, without loading it (the version string may sit anywhere in .rodata)."""
    path = Path(path)
    version = build_id = None
    try:
        with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
            match = _VERSION.search(data)
            if match:
                version = ".".join(g.decode() for g in match.groups()[:3]) + match.group(4).decode(errors="replace")
            build_id = _build_id(data)
    except (OSError, ValueError):
        pass
    return NcclLibrary(str(path), version, build_id)


def _build_id(data) -> str | None:
    """The NT_GNU_BUILD_ID note of a little-endian ELF64 file, from its program headers."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (phoff,) = struct.unpack_from("<Q", data, 0x20)
    phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from("<IIQQQQ", data, phoff + i * phentsize)
        if p_type != 4:  # PT_NOTE
            continue
        at, end = p_offset, p_offset + p_filesz
        while at + 12 <= end:
            namesz, descsz, kind = struct.unpack_from("<III", data, at)
            name_at = at + 12
            desc_at = name_at + ((namesz + 3) & ~3)
            if kind == 3 and data[name_at : name_at + namesz].rstrip(b"\x00") == b"GNU":
                return data[desc_at : desc_at + descsz].hex()
            at = desc_at + ((descsz + 3) & ~3)
    return None


def find_libraries(dirs) -> list[Path]:
    """Every libnccl.so* file in `dirs` (symlinks resolved, each file once), in search order."""
    seen, found = set(), []
    for d in dirs:
        try:
            names = sorted(Path(d).glob("libnccl.so*"))
        except OSError:
            continue
        for name in names:
            real = name.resolve()
            if real.is_file() and real not in seen:
                seen.add(real)
                found.append(real)
    return found


def loaded_library(maps_text: str) -> str | None:
    """The libnccl this process has mapped (torch's), from /proc/self/maps."""
    for line in maps_text.splitlines():
        path = line.split(maxsplit=5)[-1] if len(line.split()) >= 6 else ""
        if re.search(r"/libnccl\.so[\d.]*$", path):
            return path
    return None


def arm_hang_warning(lib: NcclLibrary, machine: str) -> str | None:
    """Why this NCCL may hang on this host, or None."""
    if machine not in ("aarch64", "arm64") or lib.numbers is None or lib.numbers >= ARM_HANG_FIXED:
        return None
    return (
        f"NCCL {lib.version} on {machine}: versions before 2.29.3 hang on ARM after 20-30 min of TP=2 (the 2.28.9 "
        f"pip wheel did; the OS package of the same number did not)"
    )


# ---- what NCCL said it used -----------------------------------------------------------------------------

_LINE = re.compile(r"NCCL INFO (.*)$")
_USING_IB = re.compile(r"^NET/IB ?: Using((?: \[\d+\]\S+)*)\s*(\[RO\])?\s*;\s*OOB (\S+)")
_USING_SOCKET = re.compile(r"^NET/Socket ?: Using((?: \[\d+\]\S+)*)")
_DEVICE = re.compile(r"\[(\d+)\]([^\s:/]+)(?::(\d+))?[^\s/]*(?:/(\S+))?")
_COMM = re.compile(r"comm 0x[0-9a-f]+ rank (\d+) nRanks (\d+) nNodes (\d+)")
_CHANNEL = re.compile(r"^Channel (\d+)(?:/\d+)? : (\d+)\[\d+\] -> (\d+)\[\d+\] (?:\[(send|receive)\] )?via (\S+)")
_CHANNELS = re.compile(r"^(\d+) coll channels, (\d+) collnet channels, (\d+) nvls channels, (\d+) p2p channels")
_GID = re.compile(r"^NET/IB: \w+: NCCL (?:Merged)?Dev \d+ IbDev (\d+) Port (\d+) qp_num \d+ mtu (\d+) GID (-?\d+)")
_GID_ENV = re.compile(r"^NCCL_IB_GID_INDEX set by environment to (-?\d+)")
_TUNING = re.compile(r"^(\w+): (\d+) Bytes -> Algo (\w+) proto (\w+)")
_NETWORK = re.compile(r"^Using network (\S+)")
_TUNER = re.compile(r"^Successfully loaded external tuner plugin (\S+)")


@dataclass
class Communicator:
    """One communicator's set-up as NCCL logged it."""

    rank: int
    nranks: int
    nnodes: int
    channels: int | None = None
    transports: list[str] = field(default_factory=list)  # distinct "via" kinds: NET/IB, NET/Socket, P2P/CUMEM, SHM/direct
    net_devices: list[int] = field(default_factory=list)  # indexes into the network's device list that channels used

    def as_dict(self, devices: list[str]) -> dict:
        return {
            "rank": self.rank,
            "nranks": self.nranks,
            "nnodes": self.nnodes,
            "channels": self.channels,
            "transports": self.transports,
            "hcas_used": [devices[i] for i in self.net_devices if i < len(devices)],
        }


@dataclass
class NcclUsed:
    """What one process's NCCL logged: its version, network, devices, GID and each communicator."""

    version: str | None = None
    network: str | None = None  # "IB" or "Socket" (the net plugin's name otherwise)
    devices: list[str] = field(default_factory=list)  # "rocep1s0f1:1/RoCE" as NCCL lists them
    oob: str | None = None  # the interface and address NCCL's own sockets use
    gid_index: int | None = None
    tuner: str | None = None
    communicators: list[Communicator] = field(default_factory=list)
    choices: dict[str, dict[str, str]] = field(default_factory=dict)  # op -> bytes -> "ALGO/PROTO"

    def as_dict(self) -> dict:
        names = [d.split("/")[0] for d in self.devices]
        return {
            "version": self.version,
            "network": self.network,
            "devices": self.devices,
            "oob": self.oob,
            "gid_index": self.gid_index,
            "tuner": self.tuner,
            "communicators": [c.as_dict(names) for c in self.communicators],
            "choices": self.choices,
        }


def parse_log(text: str) -> NcclUsed:
    """NCCL's INFO lines (any prefix: "host:pid:tid [dev] NCCL INFO ...") into an NcclUsed."""
    used = NcclUsed()
    comm: Communicator | None = None
    for raw in text.splitlines():
        found = _LINE.search(raw)
        if not found:
            continue
        line = found.group(1).strip()
        if line.startswith("NCCL version "):
            used.version = used.version or line.split()[2]
        elif m := _USING_IB.match(line):
            used.network, used.oob = used.network or "IB", m.group(3)
            used.devices = [f"{d[1]}:{d[2] or 1}" + (f"/{d[3]}" if d[3] else "") for d in _DEVICE.findall(m.group(1))]
        elif m := _USING_SOCKET.match(line):
            used.devices = used.devices or [f"{d[1]}" for d in _DEVICE.findall(m.group(1))]
        elif m := _NETWORK.match(line):
            used.network = m.group(1)
        elif m := _COMM.search(line):
            comm = Communicator(int(m.group(1)), int(m.group(2)), int(m.group(3)))
            used.communicators.append(comm)
        elif (m := _CHANNEL.match(line)) and comm is not None:
            via = m.group(5)
            kind = "/".join(via.split("/")[:2])
            if kind not in comm.transports:
                comm.transports.append(kind)
            parts = via.split("/")
            if parts[0] == "NET" and len(parts) > 2:
                dev = int(re.match(r"\d+", parts[2]).group()) if re.match(r"\d+", parts[2]) else None
                if dev is not None and dev not in comm.net_devices:
                    comm.net_devices.append(dev)
        elif (m := _CHANNELS.match(line)) and comm is not None:
            comm.channels = int(m.group(1))
        elif m := _GID.match(line):
            used.gid_index = int(m.group(4))
        elif m := _GID_ENV.match(line):
            used.gid_index = used.gid_index if used.gid_index is not None else int(m.group(1))
        elif m := _TUNING.match(line):
            used.choices.setdefault(m.group(1), {})[m.group(2)] = f"{m.group(3)}/{m.group(4)}"
        elif m := _TUNER.match(line):
            used.tuner = m.group(1)
    return used


def problems(record: dict) -> list[str]:
    """What makes an NCCL baseline unfair, from one rank's `NcclUsed.as_dict()`: sockets, or one twin of several."""
    found = []
    names = [d.split("/")[0] for d in record.get("devices") or []]
    for comm in record.get("communicators") or []:
        if comm.get("nnodes", 1) < 2:
            continue  # within one box NCCL uses no network
        if any(t == "NET/Socket" for t in comm.get("transports", [])) or record.get("network") == "Socket":
            found.append(f"a {comm['nranks']}-rank communicator ran over sockets (NET/Socket), not RDMA")
        used = comm.get("hcas_used") or []
        if len(names) > 1 and len(used) == 1:
            found.append(f"a {comm['nranks']}-rank communicator used one HCA ({used[0]}) of {len(names)} ({', '.join(names)})")
    return list(dict.fromkeys(found))


def summary(record: dict | None) -> str:
    """One line for `arxtune show`: network, HCAs, GID, channels, and the choices where NCCL printed them."""
    if not record:
        return "not recorded"
    if record.get("error"):
        return f"not recorded ({record['error']})"
    parts = [f"NCCL {record.get('version') or '?'}"]
    comms = [c for c in record.get("communicators") or [] if c.get("nnodes", 1) > 1] or record.get("communicators") or []
    transports = sorted({t for c in comms for t in c.get("transports", [])})
    parts.append(("via " + "+".join(transports)) if transports else f"network {record.get('network') or '?'}")
    used = sorted({h for c in comms for h in c.get("hcas_used", [])})
    if used:
        parts.append("HCAs " + ",".join(used))
    if record.get("gid_index") is not None:
        parts.append(f"GID {record['gid_index']}")
    channels = sorted({c["channels"] for c in comms if c.get("channels") is not None})
    if channels:
        parts.append("channels " + "/".join(map(str, channels)))
    if record.get("tuner"):
        parts.append(f"tuner {record['tuner']}")
    choices = record.get("choices") or {}
    parts.append(
        "algo/proto "
        + (
            "; ".join(
                f"{op} " + ",".join(f"{b}:{c}" for b, c in sorted(by.items(), key=lambda kv: int(kv[0])))
                for op, by in sorted(choices.items())
            )
            if choices
            else "not printed"
        )
    )
    return ", ".join(parts)


# ---- the settings a pair needs ---------------------------------------------------------------------------

#: The variables `pair_settings` derives, in the order doctor prints them.
PAIR_VARIABLES = ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME")


@dataclass(frozen=True)
class PairSettings:
    values: dict[str, str]
    problem: str | None = None  # why one of them cannot be derived

    def export_lines(self) -> list[str]:
        return [f"export {k}={v}" for k, v in self.values.items()]


def pair_settings(endpoints) -> PairSettings:
    """From the endpoints arx would use (every active twin with its RoCE v2 IPv4 GID): the HCAs with
    their ports, the one GID index they share, and the netdev of the first for NCCL's own sockets."""
    if not endpoints:
        return PairSettings({}, "no RDMA device with an active port and a RoCE v2 IPv4 GID")
    values = {"NCCL_IB_HCA": "=" + ",".join(f"{e.device}:{e.port}" for e in endpoints)}
    indexes = sorted({e.gid.index for e in endpoints})
    problem = None
    if len(indexes) == 1:
        values["NCCL_IB_GID_INDEX"] = str(indexes[0])
    else:
        problem = (
            f"the twins' RoCE v2 IPv4 GIDs sit at different indexes ({', '.join(f'{e.device} {e.gid.index}' for e in endpoints)}); "
            f"one NCCL_IB_GID_INDEX cannot fit both: leave it unset (NCCL then picks per device, NCCL_IB_ADDR_FAMILY=AF_INET)"
        )
    netdev = endpoints[0].gid.netdev
    if netdev:
        values["NCCL_SOCKET_IFNAME"] = f"={netdev}"
    return PairSettings(values, problem)


# ---- capturing the log in a sweep -------------------------------------------------------------------------

#: What the sweep has NCCL log: set-up only, never a line per call (the TUNING and COLL subsystems
#: print one per collective, which would be timed along with it).
DEBUG_SUBSYS = "INIT,ENV,NET,GRAPH"


@dataclass
class LogCapture:
    """NCCL's log for this process: the settings that route it to a file, or why it cannot be read."""

    settings: dict[str, str]  # what to add to the environment before NCCL starts (empty: the user's own stand)
    pattern: str | None  # NCCL_DEBUG_FILE as NCCL reads it (%h: host up to its first dot, %p: pid)
    reason: str | None = None  # why nothing will be recorded

    @classmethod
    def plan(cls, environ, directory: str) -> "LogCapture":
        level = environ.get("NCCL_DEBUG", "").strip().upper()
        own = environ.get("NCCL_DEBUG_FILE", "").strip()
        if level and level not in ("INFO", "TRACE"):
            return cls({}, None, f"NCCL_DEBUG={level} is set, so NCCL logs no set-up")
        if level and not own:
            return cls({}, None, f"NCCL_DEBUG={level} is set without NCCL_DEBUG_FILE, so NCCL's log goes to the terminal")
        if level:
            return cls({}, own)
        pattern = f"{directory}/arxtune-nccl.%h.%p.log"
        return cls({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS, "NCCL_DEBUG_FILE": pattern}, pattern)

    def path(self, hostname: str, pid: int) -> Path | None:
        if self.pattern is None:
            return None
        return Path(self.pattern.replace("%h", hostname.split(".")[0]).replace("%p", str(pid)))

    def record(self, hostname: str, pid: int, rank: int) -> dict:
        """This rank's `NcclUsed.as_dict()` (with its rank and host), or {"error": why not}."""
        path = self.path(hostname, pid)
        if path is None:
            return {"rank": rank, "host": hostname, "error": self.reason}
        try:
            text = path.read_text(errors="replace")
        except OSError as exc:
            return {"rank": rank, "host": hostname, "error": f"NCCL's log {path} cannot be read ({exc.strerror})"}
        return {"rank": rank, "host": hostname, **parse_log(text).as_dict()}
