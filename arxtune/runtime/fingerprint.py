"""What a group runs on: recorded by sweeps, compared at start-up by the runtime.

Cheap facts only (no pyverbs, no NVML): the host name, the device name, the
NVIDIA driver version from /proc, and the RDMA device names from sysfs.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, fields
from pathlib import Path

import torch

NVIDIA_VERSION_FILE = Path("/proc/driver/nvidia/version")
RDMA_CLASS_DIR = Path("/sys/class/infiniband")


@dataclass(frozen=True)
class Fingerprint:
    """What a run was measured on; compared with the running group at start-up."""

    world_size: int
    device_type: str = ""
    hostnames: tuple[str, ...] = ()
    device_names: tuple[str, ...] = ()
    driver_version: str | None = None
    torch_version: str | None = None
    nccl_version: str | None = None
    rdma_devices: tuple[str, ...] | None = None

    def differences(self, running: "Fingerprint") -> list[str]:
        """'what: recorded vs running' for every field known on both sides that differs (hosts as sets)."""
        found = []
        for f in fields(self):
            recorded, now = getattr(self, f.name), getattr(running, f.name)
            if recorded in (None, "", ()) or now in (None, ""):
                continue
            if isinstance(recorded, tuple):
                recorded, now = sorted(set(recorded)), sorted(set(now))
            if recorded != now:
                found.append(f"{f.name} {_show(recorded)} vs {_show(now)}")
        return found


def _show(value) -> str:
    return (",".join(value) or "none") if isinstance(value, list) else str(value)


def driver_version() -> str | None:
    """The NVIDIA kernel driver's version, e.g. '580.95.05'; None without the driver."""
    try:
        first = NVIDIA_VERSION_FILE.read_text().splitlines()[0]
    except (OSError, IndexError):
        return None
    words = [w for w in first.split() if w[:1].isdigit() and "." in w]
    return words[0] if words else None


def rdma_devices() -> list[str]:
    try:
        return sorted(p.name for p in RDMA_CLASS_DIR.iterdir())
    except OSError:
        return []


def host_facts(device: torch.device) -> dict:
    """This rank's host: name, device, driver, RDMA devices."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"hostname": socket.gethostname(), "device": name, "driver": driver_version(), "rdma_devices": rdma_devices()}


def nccl_version(device: torch.device) -> str | None:
    return ".".join(map(str, torch.cuda.nccl.version())) if device.type == "cuda" else None


def running_fingerprint(world_size: int, device: torch.device, hosts: list[dict]) -> Fingerprint:
    """The fingerprint of a running group from every rank's host_facts()."""
    return Fingerprint(
        world_size=world_size,
        device_type=device.type,
        hostnames=tuple(h["hostname"] for h in hosts),
        device_names=tuple(h["device"] for h in hosts),
        driver_version=hosts[0].get("driver"),
        torch_version=torch.__version__,
        nccl_version=nccl_version(device),
        rdma_devices=tuple(sorted({d for h in hosts for d in h.get("rdma_devices", [])})),
    )
