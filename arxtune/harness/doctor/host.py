"""Where doctor reads this machine from, and the few things it must ask a library about.

A `Host` names the roots of every file doctor reads (sysfs, /proc, /etc, the home
directory, the library path, the environment), so the unit tier runs each check on a
fake tree; the three probes (pyverbs, the GPU, the netdevs' addresses) are objects a
test replaces. The real probes are below: they are the only code here that opens an
RDMA device, loads CUDA's driver or runs `ip`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import platform
import resource
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

_MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}  # enum ibv_mtu -> bytes


class Pyverbs:
    """What doctor asks pyverbs: whether it imports, which devices it sees, a port's MTU, a registration."""

    def status(self) -> tuple[str | None, dict]:
        """(import error or None, {"version", "file", "bundled"})."""
        try:
            import pyverbs
            import pyverbs.device  # noqa: F401  the compiled part: this is where a missing libibverbs symbol shows
        except Exception as exc:  # ImportError, or OSError from the loader
            return f"{type(exc).__name__}: {exc}", {}
        from importlib import metadata

        try:
            version = metadata.version("pyverbs")
        except metadata.PackageNotFoundError:
            version = "unknown (not installed as a distribution)"
        root = Path(pyverbs.__file__).parent
        return None, {"version": version, "file": str(root), "bundled": (root.parent / "pyverbs.libs").is_dir()}

    def device_names(self) -> list[str]:
        import pyverbs.device as d

        return sorted(dev.name.decode() for dev in d.get_device_list())

    def active_mtu(self, device: str, port: int) -> int | None:
        from pyverbs.device import Context

        ctx = Context(name=device)
        try:
            return _MTU.get(ctx.query_port(port).active_mtu)
        finally:
            ctx.close()

    def register(self, device: str, nbytes: int) -> str | None:
        """Register `nbytes` of ordinary memory on `device` as arx does; the error, or None."""
        import ctypes

        from arxtune.runtime.rdma.connection import e
        from pyverbs.device import Context
        from pyverbs.mr import MR
        from pyverbs.pd import PD

        buf = ctypes.create_string_buffer(nbytes)
        ctx = Context(name=device)
        try:
            pd = PD(ctx)
            try:
                MR(pd, nbytes, e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE, address=ctypes.addressof(buf)).close()
            finally:
                pd.close()
        except Exception as exc:
            return f"{type(exc).__name__}: {exc}"
        finally:
            ctx.close()
        return None


class Gpus:
    """What the GPUs say about reaching host memory and the NIC (cuDeviceGetAttribute)."""

    ATTRIBUTES = {
        "integrated": 18,
        "pageable_memory_access": 88,
        "host_page_tables": 100,
        "gpu_direct_rdma": 116,
        "dma_buf": 124,
    }  # CUdevice_attribute, cuda.h

    def list(self) -> list[dict]:
        import torch

        if not torch.cuda.is_available():
            return []
        from arxtune.runtime.rdma.graph.memory import _libcuda
        import ctypes

        cuda = _libcuda()
        cuda.cuInit(0)
        found = []
        for i in range(torch.cuda.device_count()):
            dev, value = ctypes.c_int(), ctypes.c_int()
            cuda.cuDeviceGet(ctypes.byref(dev), i)
            attrs = {}
            for name, number in self.ATTRIBUTES.items():
                attrs[name] = int(value.value) if cuda.cuDeviceGetAttribute(ctypes.byref(value), number, dev) == 0 else None
            major, minor = torch.cuda.get_device_capability(i)
            found.append({"index": i, "name": torch.cuda.get_device_name(i), "capability": f"{major}.{minor}", **attrs})
        return found


def ip_addresses() -> dict[str, list[str]]:
    """netdev -> its IPv4 interfaces ("10.0.0.1/24"), from `ip -j -4 addr`; {} where `ip` is missing."""
    try:
        out = subprocess.run(["ip", "-j", "-4", "addr", "show"], capture_output=True, text=True, timeout=10).stdout
        links = json.loads(out or "[]")
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return {}
    return {
        link["ifname"]: [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", []) if a.get("family") == "inet"] for link in links
    }


def _memlock() -> int | None:
    soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return None if soft == resource.RLIM_INFINITY else soft


@dataclass
class Host:
    """One machine as doctor reads it. Every path is under `root` (or `home`), so tests hand in a fake tree."""

    root: Path = Path("/")
    home: Path = field(default_factory=Path.home)
    env: Mapping[str, str] = field(default_factory=lambda: os.environ)
    machine: str = field(default_factory=platform.machine)
    verbs: Pyverbs = field(default_factory=Pyverbs)
    gpus: Gpus = field(default_factory=Gpus)
    addresses: dict[str, list[str]] | None = None  # None: ask `ip`
    memlock: int | None | str = "ask"  # bytes, None for unlimited; "ask": getrlimit
    euid: int = field(default_factory=os.geteuid)
    torch_nccl: str | None = "ask"  # the libnccl torch loads; "ask": /proc/self/maps, then torch's own wheel

    @property
    def sysfs(self) -> Path:
        return self.root / "sys" / "class" / "infiniband"

    @property
    def net(self) -> Path:
        return self.root / "sys" / "class" / "net"

    @property
    def proc(self) -> Path:
        return self.root / "proc"

    @property
    def etc(self) -> Path:
        return self.root / "etc"

    def read(self, path: Path) -> str | None:
        try:
            return path.read_text()
        except OSError:
            return None

    def memlock_limit(self) -> int | None:
        return _memlock() if self.memlock == "ask" else self.memlock  # type: ignore[return-value]

    def ipv4(self) -> dict[str, list[ipaddress.IPv4Interface]]:
        raw = ip_addresses() if self.addresses is None else self.addresses
        return {name: [ipaddress.IPv4Interface(a) for a in addrs] for name, addrs in raw.items()}

    def library_dirs(self) -> list[Path]:
        """Where the dynamic loader looks, in its order: LD_LIBRARY_PATH, /etc/ld.so.conf's directories, the defaults."""
        dirs = [Path(d) for d in self.env.get("LD_LIBRARY_PATH", "").split(":") if d]
        dirs += self._ld_conf(self.etc / "ld.so.conf", set())
        dirs += [self.root / d for d in ("lib", "usr/lib", f"lib/{self.machine}-linux-gnu", f"usr/lib/{self.machine}-linux-gnu")]
        return list(dict.fromkeys(dirs))

    def _ld_conf(self, path: Path, seen: set) -> list[Path]:
        if path in seen:
            return []
        seen.add(path)
        found = []
        for line in (self.read(path) or "").splitlines():
            line = line.split("#")[0].strip()
            if line.startswith("include "):
                pattern = line.split(None, 1)[1].lstrip("/")
                for inc in sorted(self.root.glob(pattern)):
                    found += self._ld_conf(inc, seen)
            elif line:
                found.append(self.root / line.lstrip("/"))
        return found

    def loaded_nccl(self) -> str | None:
        """The libnccl torch uses: mapped into this process, else the one in torch's own NVIDIA wheel."""
        if self.torch_nccl != "ask":
            return self.torch_nccl
        from arxtune.harness.nccl_facts import loaded_library

        mapped = loaded_library(self.read(self.proc / "self" / "maps") or "")
        if mapped:
            return mapped
        try:
            import nvidia.nccl  # the wheel torch's CUDA builds depend on

            for base in nvidia.nccl.__path__:
                candidate = Path(base) / "lib" / "libnccl.so.2"
                if candidate.exists():
                    return str(candidate)
        except ImportError:
            pass
        return None
