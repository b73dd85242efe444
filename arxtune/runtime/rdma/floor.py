"""The fabric's latency floor: perftest's ib_write_lat, 2-byte RDMA writes.

No collective over this fabric can beat one write's latency, so results carry
it as the floor to compare against. Measured here with server and client on
the same device (loopback through the NIC), which is what one machine can do.
"""

from __future__ import annotations

import math
import shutil
import socket
import subprocess
import time

from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.device import read_devices, select_endpoints
from arxtune.runtime.rdma.errors import RdmaError, RdmaUnavailable


def parse_write_lat(output: str, size: int = 2) -> float:
    """t_typical[usec] of the row for `size` bytes in ib_write_lat's table."""
    col = None
    for line in output.splitlines():
        fields = line.split()
        if "t_typical[usec]" in fields and fields[0] == "#bytes":
            col = fields.index("t_typical[usec]")
        elif col is not None and len(fields) > col and fields[0] == str(size) and fields[1].isdigit():
            value = float(fields[col])
            if not (math.isfinite(value) and value > 0):  # perftest's cycles-to-time conversion failed (a VM's clock)
                raise RdmaError(f"ib_write_lat reported a {size}-byte t_typical of {fields[col]} us, not a latency", op="ib_write_lat")
            return value
    raise RdmaError(f"could not find a {size}-byte t_typical row in ib_write_lat output:\n{output}", op="ib_write_lat")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: Runs of ib_write_lat before giving up on a figure that is not a latency (inf, 0): in VMs its clock
#: conversion fails now and then.
ATTEMPTS = 2


def measure_write_latency_us(device: str | None = None, timeout_s: float = 60, iters: int = 1000) -> float:
    """Typical 2-byte RDMA write latency in us on `device` (default: arx's automatic choice)."""
    deadline, left = time.monotonic() + timeout_s, ATTEMPTS
    while True:
        output = _run_write_lat(device, deadline, timeout_s, iters)
        try:
            return parse_write_lat(output)
        except RdmaError:
            left -= 1
            if not left:
                raise


def _run_write_lat(device: str | None, deadline: float, timeout_s: float, iters: int) -> str:
    """One server and client run of ib_write_lat over loopback; the client's output."""
    exe = shutil.which("ib_write_lat")
    if exe is None:
        raise RdmaUnavailable("ib_write_lat not found: install perftest (apt-get install perftest)")
    cfg = RdmaConfig.resolve()
    if device is not None:
        cfg = RdmaConfig.resolve({"devices": [device]})
    ep = select_endpoints(cfg, read_devices())[0]
    port = _free_port()
    # -F: skip the CPU-frequency check (fails under VMs); -x: the RoCE v2 GID (perftest's default 0 may be v1)
    cmd = [exe, "-d", ep.device, "-i", str(ep.port), "-x", str(ep.gid.index), "-s", "2", "-n", str(iters), "-F", "-p", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        while True:  # the client fails until the server listens
            left = deadline - time.monotonic()
            if left <= 0:
                raise RdmaError(f"ib_write_lat did not finish within {timeout_s:g} s", device=ep.device, op="ib_write_lat")
            try:
                client = subprocess.run(cmd + ["127.0.0.1"], capture_output=True, text=True, timeout=left)
            except subprocess.TimeoutExpired:
                continue
            if client.returncode == 0:
                return client.stdout
            if server.poll() is not None:
                out = server.stdout.read() if server.stdout else ""
                raise RdmaError(
                    f"ib_write_lat server exited {server.returncode}:\n{out}\nclient:\n{client.stdout}{client.stderr}",
                    device=ep.device,
                    op="ib_write_lat",
                )
            time.sleep(0.2)
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
