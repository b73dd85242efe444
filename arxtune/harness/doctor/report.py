"""`arxtune doctor --report FILE`: one archive to attach to a report, with nothing secret in it.

A gzipped tar of: `doctor.json` (every row as data, and across the boxes every rank's
report, the table and the ping-pong figures), `environment.txt` (only ARXTUNE_*, NCCL_*,
CUDA_* and TRITON_* variables: no other part of the environment goes in), the RDMA
devices' sysfs files (state, link layer, rate, GIDs and their types and netdevs) and their
netdevs' MTU and state, /proc/meminfo and the kernel's version, and the NCCL
configuration files in force (/etc/nccl.conf, ~/.nccl.conf).
"""

from __future__ import annotations

import io
import json
import platform
import tarfile
import time
from pathlib import Path

from arxtune.harness.doctor.checks import nccl_settings
from arxtune.harness.doctor.host import Host
from arxtune.harness.doctor.rows import Row
from arxtune.runtime.fileio import check_output, write_bytes_atomic

#: The only environment variables an archive carries.
ENV_PREFIXES = ("ARXTUNE_", "NCCL_", "CUDA_", "TRITON_")
#: Files under each RDMA port that say how it stands (no keys, counters or firmware blobs).
PORT_FILES = ("state", "phys_state", "link_layer", "rate")
REPORT_VERSION = 1


def _is_report(path: Path) -> bool:
    try:
        with tarfile.open(path) as tar:
            return "arxtune-doctor/doctor.json" in tar.getnames()
    except (OSError, tarfile.TarError):
        return False


def _sysfs_files(host: Host) -> dict[str, str]:
    """Relative name -> text of the RDMA devices' port files and their netdevs' MTU and state."""
    out, netdevs = {}, set()
    if not host.sysfs.is_dir():
        return out
    for dev in sorted(host.sysfs.iterdir()):
        for name in ("node_type", "fw_ver", "hca_type"):
            if (text := host.read(dev / name)) is not None:
                out[f"sys/class/infiniband/{dev.name}/{name}"] = text
        for port in sorted((dev / "ports").glob("*")) if (dev / "ports").is_dir() else ():
            base = f"sys/class/infiniband/{dev.name}/ports/{port.name}"
            for name in PORT_FILES:
                if (text := host.read(port / name)) is not None:
                    out[f"{base}/{name}"] = text
            for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
                for entry in (
                    sorted((port / sub).glob("*"), key=lambda p: int(p.name) if p.name.isdigit() else 0) if (port / sub).is_dir() else ()
                ):
                    text = host.read(entry)
                    if text and text.strip() and text.strip() != "0000:0000:0000:0000:0000:0000:0000:0000":
                        out[f"{base}/{sub}/{entry.name}"] = text
                        if sub == "gid_attrs/ndevs":
                            netdevs.add(text.strip())
    for nd in sorted(netdevs):
        for name in ("mtu", "operstate", "speed"):
            if (text := host.read(host.net / nd / name)) is not None:
                out[f"sys/class/net/{nd}/{name}"] = text
    return out


def build(rows: list[Row], host: Host | None = None, group: dict | None = None) -> bytes:
    """The archive's bytes (gzipped tar)."""
    host = host or Host()
    doc = {
        "kind": "arxtune-doctor-report",
        "version": REPORT_VERSION,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": platform.node(),
        "machine": host.machine,
        "rows": [r.as_dict() for r in rows],
        "group": group,
    }
    files = {
        "doctor.json": json.dumps(doc, indent=2, sort_keys=True, default=str) + "\n",
        "environment.txt": "".join(f"{k}={v}\n" for k, v in sorted(host.env.items()) if k.startswith(ENV_PREFIXES)),
        "nccl-settings.txt": "".join(f"{n}={v}  # {w}\n" for n, v, w in nccl_settings(host)),
        **_sysfs_files(host),
    }
    for name, path in (
        ("proc/meminfo", host.proc / "meminfo"),
        ("proc/version", host.proc / "version"),
        ("etc/nccl.conf", host.etc / "nccl.conf"),
        ("home/.nccl.conf", host.home / ".nccl.conf"),
    ):
        if (text := host.read(path)) is not None:
            files[name] = text
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"arxtune-doctor/{name}")
            info.size, info.mtime, info.mode = len(data), int(time.time()), 0o644
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def write(path: str | Path, rows: list[Row], host: Host | None = None, group: dict | None = None) -> Path:
    """Write the archive whole or not at all; an existing file is replaced only if it is an older report."""
    target = check_output(path, "--report", (), _is_report)
    return write_bytes_atomic(target, build(rows, host, group), "doctor report")
