"""A fake machine for doctor's checks: sysfs, /proc, /etc and library trees under one folder, and fake probes.

`spark(tmp)` is a healthy DGX Spark as public reports describe it (two twins of the cabled
port, RoCE v2 IPv4 GID 3, MTU 9000, NCCL 2.29.3 on aarch64, an integrated GPU); each test
breaks one thing and checks that its row fails and names the fix.
"""

from __future__ import annotations

import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from arxtune.harness.doctor.host import Host

V4 = "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}"
LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"


def v4(a, b, c, d):
    return V4.format(a, b, c, d)


def write(path: Path, text: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)  # type: ignore[arg-type]
    return path


def rdma_device(
    root: Path, name: str, gids, *, state="4: ACTIVE", link_layer="Ethernet", pci: str | None = None, netdev_mtu: int | None = 9000
) -> None:
    """gids: [(gid, type, netdev)]; pci: the PCI function ("0000:01:00.1") its `device` link names."""
    port = root / "sys/class/infiniband" / name / "ports/1"
    write(port / "state", state + "\n")
    write(port / "link_layer", link_layer + "\n")
    for i, (gid, kind, ndev) in enumerate(gids):
        write(port / "gids" / str(i), gid + "\n")
        write(port / "gid_attrs/types" / str(i), kind + "\n")
        write(port / "gid_attrs/ndevs" / str(i), ndev + "\n")
        if netdev_mtu is not None:
            write(root / "sys/class/net" / ndev / "mtu", f"{netdev_mtu}\n")
    if pci:
        os.symlink(f"../../../devices/pci{pci[:4]}:00/{pci}", root / "sys/class/infiniband" / name / "device")


def elf_with(version: str | None, build_id: bytes = b"\x12\x34\x56\x78" * 5, extra: bytes = b"") -> bytes:
    """A minimal little-endian ELF64 file: one PT_NOTE with a GNU build id, then `NCCL version ...` in its data."""
    note = struct.pack("<III", 4, len(build_id), 3) + b"GNU\x00" + build_id
    phoff, note_at = 64, 64 + 56
    header = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)
    header += struct.pack("<HHIQQQIHHHHHH", 3, 183, 1, 0, phoff, 0, 0, 64, 56, 1, 64, 0, 0)
    phdr = struct.pack("<IIQQQQQQ", 4, 4, note_at, 0, 0, len(note), len(note), 4)
    body = note + b"\x00" * 32 + (f"NCCL version {version}".encode() + b"\x00" if version else b"") + extra
    return header + phdr + body


@dataclass
class FakeVerbs:
    error: str | None = None
    seen: list[str] | None = None  # None: every device in the fake sysfs
    mtus: dict[str, int] = field(default_factory=dict)
    register_errors: dict[str, str] = field(default_factory=dict)
    root: Path | None = None
    bundled: bool = True

    def status(self):
        if self.error:
            return self.error, {}
        return None, {"version": "59.0+bundled.1", "file": "/venv/site-packages/pyverbs", "bundled": self.bundled}

    def device_names(self):
        if self.seen is not None:
            return self.seen
        return sorted(p.name for p in (self.root / "sys/class/infiniband").iterdir())

    def active_mtu(self, device, port):
        return self.mtus.get(device, 4096)

    def register(self, device, nbytes):
        return self.register_errors.get(device)


@dataclass
class FakeGpus:
    gpus: list[dict] = field(default_factory=list)

    def list(self):
        return self.gpus


GB10 = {
    "index": 0,
    "name": "NVIDIA GB10",
    "capability": "12.1",
    "integrated": 1,
    "pageable_memory_access": 1,
    "host_page_tables": 1,
    "gpu_direct_rdma": 0,
    "dma_buf": 0,
}


def spark(root: Path, **host_args) -> Host:
    """A healthy Spark: the cabled port's two twins (PCI domains 0000 and 0002) with RoCE v2 IPv4 GIDs at 3."""
    gids = lambda nd, ip: [(LINK_LOCAL, "IB/RoCE v1", nd), (LINK_LOCAL, "RoCE v2", nd), (ip, "IB/RoCE v1", nd), (ip, "RoCE v2", nd)]  # noqa: E731
    rdma_device(root, "rocep1s0f1", gids("enp1s0f1np1", v4(10, 0, 0, 1)), pci="0000:01:00.1")
    rdma_device(root, "roceP2p1s0f1", gids("enP2p1s0f1np1", v4(10, 0, 1, 1)), pci="0002:01:00.1")
    rdma_device(root, "rocep1s0f0", [], state="1: DOWN", pci="0000:01:00.0")
    rdma_device(root, "roceP2p1s0f0", [], state="1: DOWN", pci="0002:01:00.0")
    write(root / "proc/meminfo", "MemTotal:       128000000 kB\nCmaTotal:         524288 kB\nCmaFree:          500000 kB\n")
    lib = write(root / "usr/lib/aarch64-linux-gnu/libnccl.so.2.29.3", elf_with("2.29.3+cuda13.0"))
    write(root / "proc/self/maps", f"ffff0000-ffff1000 r-xp 00000000 00:00 1  {lib}\n")
    write(root / "etc/ld.so.conf", "include /etc/ld.so.conf.d/*.conf\n")
    write(root / "etc/ld.so.conf.d/aarch64.conf", "/usr/lib/aarch64-linux-gnu\n")
    (root / "etc/libibverbs.d").mkdir(parents=True, exist_ok=True)
    home = root / "home"
    home.mkdir(exist_ok=True)
    args = dict(
        root=root,
        home=home,
        env={},
        machine="aarch64",
        verbs=FakeVerbs(root=root),
        gpus=FakeGpus([dict(GB10)]),
        addresses={"enp1s0f1np1": ["10.0.0.1/24"], "enP2p1s0f1np1": ["10.0.1.1/24"], "wlP9s9": ["192.168.1.20/24"]},
        memlock=None,
        euid=1000,
        torch_nccl=str(lib),
    )
    args.update(host_args)
    return Host(**args)  # type: ignore[arg-type]
