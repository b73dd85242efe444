"""`arxtune doctor`: what this machine offers the backends, and which can run.

Plain reads (sysfs, rlimits, torch) plus a cheap open of each RDMA device; no
process group is needed, so backends that need torchrun are reported as such.
"""

from __future__ import annotations

import importlib.util
import ipaddress

import torch

from arxtune.runtime import env
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.device import check_memlock, memlock_limit, netdev_mtu, read_devices, select_endpoints, select_gid
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout

_MTU = {1: 256, 2: 512, 3: 1024, 4: 2048, 5: 4096}


def _active_mtu(device: str, port: int) -> str:
    try:
        from pyverbs.device import Context

        ctx = Context(name=device)
        try:
            return str(_MTU.get(ctx.query_port(port).active_mtu, "?"))
        finally:
            ctx.close()
    except Exception as exc:  # doctor reports, it never fails
        return f"unknown ({type(exc).__name__})"


def _rdma_rows(cfg: RdmaConfig) -> list[tuple[str, str]]:
    devices = read_devices()
    if not devices:
        return [("rdma devices", "none (/sys/class/infiniband is empty or absent)")]
    rows = []
    for dev in devices:
        for port in dev.ports:
            where = f"{dev.name} port {port.port}"
            mtus = ", ".join(f"{n} MTU {netdev_mtu(n)}" for n in port.netdevs) or "no netdev"
            rows.append((where, f"{port.state}, {port.link_layer}, active MTU {_active_mtu(dev.name, port.port)} ({mtus})"))
            try:
                chosen = select_gid(port, cfg.gid_index).index
            except RdmaUnavailable:
                chosen = None
            for g in port.gids:
                if g.roce_v2:
                    addr = g.ipv4 or str(ipaddress.IPv6Address(g.gid))
                    mark = "  <- arx uses this" if g.index == chosen else ""
                    rows.append((f"  GID {g.index}", f"RoCE v2 {addr} on {g.netdev or '?'}{mark}"))
            if not any(g.roce_v2 for g in port.gids):
                rows.append(("  GIDs", "no RoCE v2 GID"))
    return rows


def _gpu_rows() -> list[tuple[str, str]]:
    if not torch.cuda.is_available():
        return [("gpus", "none (torch.cuda.is_available() is False)")]
    return [(f"gpu {i}", torch.cuda.get_device_name(i)) for i in range(torch.cuda.device_count())]


def arxg_rows(reader=None, build=None) -> list[tuple[str, str]]:
    """How arxg's kernels reach host memory on each GPU, and which build of them GPU 0 loads (found on disk,
    or built here with Triton).

    `reader(ordinal)` reads the device's attributes and `build(variant, capability, source)` builds a kernel
    image (the real ones by default; tests pass fakes)."""
    if not torch.cuda.is_available():
        return [("arxg memory", "not applicable: no CUDA GPU (arxg runs CUDA tensors)")]
    from arxtune.runtime.rdma.graph.memory import memory_line, read_attributes

    rows = []
    for i in range(torch.cuda.device_count()):
        suffix = f" (gpu {i})" if torch.cuda.device_count() > 1 else ""
        rows.append((f"arxg memory{suffix}", memory_line(i, reader=reader or read_attributes)))
    from arxtune.runtime.rdma.graph import images

    major, minor = torch.cuda.get_device_capability(0)
    line = images.doctor_line(10 * major + minor, **({"build": build} if build else {}))
    return rows + [("arxg kernels", line)]


def arx_reason(cfg: RdmaConfig | None = None) -> str | None:
    """Why arx cannot run here, or None if it can (checked locally, without a process group)."""
    try:
        cfg = cfg or RdmaConfig.resolve()
        from arxtune.runtime.rdma.connection import PYVERBS_IMPORT_ERROR

        if PYVERBS_IMPORT_ERROR is not None:
            return f"pyverbs not importable ({PYVERBS_IMPORT_ERROR}); install python3-pyverbs"
        endpoints = select_endpoints(cfg, read_devices())
        check_memlock(Layout(2, cfg.slots, cfg.max_bytes, len(endpoints)).total_bytes)
    except Exception as exc:
        return str(exc)
    return None


def backend_reasons(cfg: RdmaConfig | None = None) -> dict[str, str | None]:
    """Why each built-in backend cannot run here (None: it can); backends not named are not checked without torchrun."""
    import torch.distributed as dist

    if cfg is None:
        try:
            cfg = RdmaConfig.resolve()
        except Exception:  # a bad arx setting is arx's reason, said by arx_reason
            cfg = None

    reasons: dict[str, str | None] = {
        "gloo": None if dist.is_available() and dist.is_gloo_available() else "this torch build has no gloo",
        "nccl": ("this torch build has no NCCL" if not (dist.is_available() and dist.is_nccl_available())
                 else None if torch.cuda.is_available() else "no CUDA GPU"),
    }
    reasons["torch_nccl"] = reasons["nccl"]
    arx = arx_reason(cfg)
    reasons["arx"] = reasons["arx2"] = arx
    no_cuda = None if torch.cuda.is_available() else "needs CUDA tensors; no CUDA GPU"
    reasons["symm_mem"] = reasons["symm_mem2"] = no_cuda
    reasons["arxg"] = no_cuda or (None if importlib.util.find_spec("triton") or env.ARXG_KERNELS.is_set() else
                                  "needs Triton to build its kernels, or a build made elsewhere (ARXTUNE_ARXG_KERNELS)")
    no_vllm = None if importlib.util.find_spec("vllm") else "vllm is not installed (pip install 'arxtune[vllm]')"
    reasons["vllm_cpu"] = no_vllm
    for name in ("vllm_pynccl", "vllm_custom_ar", "vllm_symm_mem"):
        reasons[name] = no_vllm or no_cuda
    return reasons


def _backend_rows(cfg: RdmaConfig) -> list[tuple[str, str]]:
    from arxtune.runtime.backends import names

    reasons = backend_reasons(cfg)
    rows = []
    for name in names():
        if name not in reasons:
            rows.append((f"backend {name}", "not checked here: run a sweep under torchrun to see"))
        elif reasons[name] is None:
            rows.append((f"backend {name}", "can run (under torchrun)"))
        else:
            rows.append((f"backend {name}", f"cannot run: {reasons[name]}"))
    return rows


def doctor() -> list[tuple[str, str]]:
    """(item, finding) rows: RDMA devices/ports/GIDs, memlock, GPUs, arxg's memory mode and build, backends."""
    try:
        cfg = RdmaConfig.resolve()
        cfg_row = []
    except Exception as exc:
        cfg = RdmaConfig()
        cfg_row = [("arx settings", f"ignored: {exc}")]
    limit = memlock_limit()
    need = Layout(2, cfg.slots, cfg.max_bytes, len(cfg.devices or (1,))).total_bytes
    memlock = "unlimited" if limit is None else f"{limit} bytes ({limit >> 10} KiB)"
    return [
        *cfg_row,
        *_rdma_rows(cfg),
        ("pinned memory (ulimit -l)", f"{memlock}; arx needs {need >> 10} KiB per rank at 2 ranks, max_bytes={cfg.max_bytes}"
                                      f" (more with more ranks)"),
        *_gpu_rows(),
        *arxg_rows(),
        *_backend_rows(cfg),
    ]


def format_report(rows: list[tuple[str, str]]) -> str:
    width = max((len(k) for k, _ in rows), default=0)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
