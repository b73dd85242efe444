"""The rows of `arxtune doctor` on one box: one function each, in the order they print (CHECKS).

Each check takes a Host and returns its rows; a failure the field has met is FAIL with the
fix in one line, something absent that a backend would need is WARN or INFO. Sources of
each failure: ../shared/FIELD-NOTES.md section 11 (docs/gb10.md lists them row by row).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from arxtune.harness import nccl_facts
from arxtune.harness.doctor.host import Host
from arxtune.harness.doctor.rows import FAIL, INFO, OK, WARN, Row
from arxtune.harness.pyverbs_wheel import SYSTEM_NEEDS, full_version
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.device import DeviceInfo, Endpoint, PortInfo, netdev_mtu, read_devices, select_gid
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.protocol import Layout

#: What to run where pyverbs is missing or is the registry's plain build.
PYVERBS_FIX = (
    f"`arxtune pyverbs install` (the rdma extra: the registry's pyverbs built with its own libibverbs, "
    f"{full_version()}; needs {SYSTEM_NEEDS})"
)
#: The MTU below which a ConnectX-7 port gives a third or less of its bandwidth.
GOOD_MTU = 4096
#: NCCL settings the field has seen hurt: name -> (whether this value hurts, FAIL or WARN, why).
HURTING: dict[str, tuple[Callable[[str], bool], str, str]] = {
    "NCCL_IB_USE_INLINE": (
        lambda v: v.strip() == "1",
        FAIL,
        "with NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS it froze PyNccl's first call on Sparks",
    ),
    "NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS": (
        lambda v: v.strip() == "1",
        FAIL,
        "with NCCL_IB_USE_INLINE it froze PyNccl's first call on Sparks",
    ),
    "NCCL_IB_DISABLE": (
        lambda v: v.strip() == "1",
        FAIL,
        "NCCL falls back to sockets: the baseline is slow and flatters every other backend",
    ),
    "NCCL_NET": (
        lambda v: v.strip().lower() == "socket",
        FAIL,
        "NCCL runs over sockets: the baseline is slow and flatters every other backend",
    ),
    "NCCL_ALGO": (lambda v: bool(v.strip()), WARN, "forces one algorithm at every size: the nccl baseline is no longer NCCL's own choice"),
    "NCCL_PROTO": (lambda v: bool(v.strip()), WARN, "forces one protocol at every size: the nccl baseline is no longer NCCL's own choice"),
}


def _config() -> tuple[RdmaConfig, list[Row]]:
    try:
        return RdmaConfig.resolve(), []
    except Exception as exc:
        return RdmaConfig(), [Row("arx settings", FAIL, f"ignored: {exc}", "fix or unset the ARXTUNE_RDMA_* variable named")]


def usable(port: PortInfo) -> Endpoint | None:
    """The endpoint arx (and NCCL) would use on this port: active, Ethernet, with a RoCE v2 IPv4 GID."""
    if not port.active or port.link_layer != "Ethernet":
        return None
    try:
        return Endpoint(port.device, port.port, select_gid(port))
    except RdmaUnavailable:
        return None


def endpoints(host: Host) -> list[Endpoint]:
    """Every usable port of every device, by device name: the twins doctor checks and NCCL_IB_HCA names."""
    return [ep for dev in read_devices(host.sysfs) for port in dev.ports if (ep := usable(port))]


# ---- pyverbs and the RDMA devices -------------------------------------------------------------------------


def check_pyverbs(host: Host) -> list[Row]:
    devices = [d.name for d in read_devices(host.sysfs)]
    error, info = host.verbs.status()
    if error:
        plain = "IBVERBS_PRIVATE" in error or "version `" in error
        why = (
            "the registry's plain pyverbs, which needs rdma-core's own libibverbs of its version" if plain else "arx, arx2 and arxg need it"
        )
        return [Row("pyverbs", FAIL if devices else WARN, f"not importable: {error}", f"{why}: {PYVERBS_FIX}")]
    where = f"{info['version']} from {info['file']}, " + ("its own libibverbs" if info["bundled"] else "the system's libibverbs")
    try:
        seen = host.verbs.device_names()
    except Exception as exc:
        seen, listing = [], f"lists no device ({exc})"
    else:
        listing = f"sees {', '.join(seen) or 'no device'}"
    missing = [d for d in devices if d not in seen]
    if missing:
        conf = host.etc / "libibverbs.d"
        where_listed = "" if conf.is_dir() else f" ({conf} is missing)"
        return [
            Row(
                "pyverbs",
                FAIL,
                f"{where}; {listing}, but sysfs has {', '.join(missing)}",
                f"no libibverbs provider loaded for {', '.join(missing)}{where_listed}: install rdma-core's providers "
                f"(apt-get install ibverbs-providers), whose /etc/libibverbs.d lists them",
                {"seen": seen, **info},
            )
        ]
    return [Row("pyverbs", OK, f"{where}; {listing}", data={"seen": seen, **info})]


def _port_row(host: Host, port: PortInfo) -> Row:
    where = f"{port.device} port {port.port}"
    netdev = port.netdevs[0] if port.netdevs else None
    netdev_mtu_value = netdev_mtu(netdev, host.net) if netdev else None
    active_mtu = None
    if port.active and host.verbs.status()[0] is None:
        try:
            active_mtu = host.verbs.active_mtu(port.device, port.port)
        except Exception:
            active_mtu = None
    ep = usable(port)
    data = {
        "device": port.device,
        "port": port.port,
        "state": port.state,
        "link_layer": port.link_layer,
        "active_mtu": active_mtu,
        "netdev": netdev,
        "netdev_mtu": netdev_mtu_value,
        "gid_index": ep.gid.index if ep else None,
        "ipv4": ep.gid.ipv4 if ep else None,
    }
    mtu = f"active MTU {active_mtu or '?'} ({netdev or 'no netdev'} MTU {netdev_mtu_value or '?'})"
    if not port.active:
        return Row(where, INFO, f"{port.state}, {port.link_layer} ({netdev or 'no netdev'}): not cabled, or its link is down", data=data)
    if port.link_layer != "Ethernet":
        return Row(where, INFO, f"ACTIVE, {port.link_layer}: not RoCE; arx and this doctor use Ethernet (RoCE v2) ports", data=data)
    if ep is None:
        return Row(
            where,
            FAIL,
            f"ACTIVE, Ethernet, {mtu}, no RoCE v2 GID with an IPv4 address",
            f"give {netdev or 'its netdev'} an IPv4 address (ip addr add A.B.C.D/24 dev {netdev or 'NETDEV'})",
            data,
        )
    finding = f"ACTIVE, Ethernet, {mtu}, RoCE v2 IPv4 GID {ep.gid.index} ({ep.gid.ipv4} on {ep.gid.netdev})"
    if active_mtu is not None and active_mtu < GOOD_MTU:
        return Row(
            where,
            WARN,
            finding,
            f"MTU {netdev_mtu_value} gives a third or less of the bandwidth: ip link set dev {netdev} mtu 9000 on both boxes",
            data,
        )
    return Row(where, OK, finding, data=data)


def check_ports(host: Host) -> list[Row]:
    devices = read_devices(host.sysfs)
    if not devices:
        return [
            Row(
                "rdma devices",
                INFO,
                f"none ({host.sysfs} is empty or absent): arx, arx2 and arxg over RDMA cannot run here",
                data={"devices": []},
            )
        ]
    return [_port_row(host, port) for dev in devices for port in dev.ports]


def _pci_function(host: Host, dev: DeviceInfo) -> tuple[str, str] | None:
    """(domain, bus:device.function) of the RDMA device's PCI function; None for software devices (rxe)."""
    try:
        name = os.path.basename(os.readlink(host.sysfs / dev.name / "device"))
    except OSError:
        return None
    domain, _, rest = name.partition(":")
    return (domain, rest) if rest.count(":") == 1 and "." in rest else None


def check_twins(host: Host) -> list[Row]:
    """A ConnectX-7 port on a Spark is two PCIe functions, in two PCI domains with the same bus, slot and
    function: both must be up with an address, or NCCL and arx get half the port (FIELD-NOTES 1, 11)."""
    devices = read_devices(host.sysfs)
    groups: dict[str, list[DeviceInfo]] = {}
    for dev in devices:
        pci = _pci_function(host, dev)
        if pci:
            groups.setdefault(pci[1], []).append(dev)
    twins = {k: v for k, v in groups.items() if len(v) > 1}
    if not twins:
        what = "no RDMA devices" if not devices else "no twins (software devices, or one PCIe function per port)"
        return [Row("twins", INFO, what, data={"groups": []})]
    rows = []
    for function, members in sorted(twins.items()):
        names = [d.name for d in members]
        up = [d.name for d in members if any(usable(p) for p in d.ports)]
        cabled = any(p.active for d in members for p in d.ports)
        data = {"function": function, "devices": names, "up": up}
        if not cabled:
            rows.append(Row(f"twins {'+'.join(names)}", INFO, "not cabled (every port down)", data=data))
        elif len(up) == len(names):
            rows.append(Row(f"twins {'+'.join(names)}", OK, "both up with a RoCE v2 IPv4 GID", data=data))
        else:
            down = [n for n in names if n not in up]
            rows.append(
                Row(
                    f"twins {'+'.join(names)}",
                    FAIL,
                    f"only {', '.join(up) or 'none'} of the cabled port's twins is usable",
                    f"bring up {', '.join(down)}'s netdev with an IPv4 address; each twin carries half the port "
                    f"(one alone tops out near 12 GB/s)",
                    data,
                )
            )
    return rows


def _cma(host: Host) -> dict[str, int]:
    found = {}
    for line in (host.read(host.proc / "meminfo") or "").splitlines():
        name, _, value = line.partition(":")
        if name in ("CmaTotal", "CmaFree", "MemTotal"):
            found[name] = int(value.split()[0])
    return found


def check_registration(host: Host) -> list[Row]:
    """Register a small buffer on each usable device, as arx does at start; CMA figures where that fails."""
    eps = endpoints(host)
    cma = _cma(host)
    cma_text = (
        f"CmaTotal {cma['CmaTotal']} kB, CmaFree {cma.get('CmaFree', '?')} kB" if "CmaTotal" in cma else "no CMA figures in /proc/meminfo"
    )
    if not eps:
        return [Row("memory registration", INFO, f"not checked: no usable RDMA device ({cma_text})", data={"cma": cma})]
    if host.verbs.status()[0] is not None:
        return [Row("memory registration", INFO, f"not checked: pyverbs is not importable ({cma_text})", data={"cma": cma})]
    errors = {}
    for ep in eps:
        error = host.verbs.register(ep.device, 4096)
        if error:
            errors[ep.device] = error
    data = {"cma": cma, "errors": errors, "bytes": 4096}
    if not errors:
        return [Row("memory registration", OK, f"4 KiB registered on {', '.join(e.device for e in eps)} ({cma_text})", data=data)]
    said = "; ".join(f"{d}: {e}" for d, e in errors.items())
    if cma.get("CmaTotal") == 0:
        fix = (
            "this kernel has no CMA memory (CmaTotal: 0 kB), and registration then fails even for 1 KiB: boot another "
            "kernel and driver (7.0.0-1019-nvidia had none; 6.17.0-1031-nvidia with driver 580.173.02 worked)"
        )
    else:
        fix = "raise ulimit -l (memlock), and see `dmesg` for the driver's reason"
    return [Row("memory registration", FAIL, f"4 KiB failed: {said} ({cma_text})", fix, data)]


def check_memlock(host: Host) -> list[Row]:
    cfg, _ = _config()
    need = Layout(2, cfg.slots, cfg.max_bytes, max(1, len(cfg.devices or endpoints(host) or (1,)))).total_bytes
    limit = host.memlock_limit()
    said = "unlimited" if limit is None else f"{limit} bytes ({limit >> 10} KiB)"
    finding = f"{said}; arx needs {need >> 10} KiB per rank at 2 ranks, max_bytes={cfg.max_bytes} (more with more ranks)"
    data = {"limit": limit, "need": need}
    if limit is None or limit >= need:
        return [Row("locked memory (ulimit -l)", OK, finding, data=data)]
    if host.euid == 0:
        return [Row("locked memory (ulimit -l)", OK, finding + "; root is not held to it", data=data)]
    return [
        Row(
            "locked memory (ulimit -l)",
            FAIL,
            finding,
            "ulimit -l unlimited (memlock in /etc/security/limits.conf; a container's --ulimit memlock=-1)",
            data,
        )
    ]


# ---- NCCL -------------------------------------------------------------------------------------------------


def check_nccl_library(host: Host) -> list[Row]:
    """The libnccl torch loads (version, build), every other one on the library path, the ARM hang."""
    loaded = host.loaded_nccl()
    others = [p for p in nccl_facts.find_libraries(host.library_dirs()) if not loaded or p != Path(loaded).resolve()]
    rows = []
    if loaded is None:
        rows.append(Row("nccl library", INFO, "none: this torch loads no NCCL (a CPU build)", data={"loaded": None}))
    else:
        lib = nccl_facts.library_info(loaded)
        data = {"loaded": lib.path, "version": lib.version, "build_id": lib.build_id}
        hang = nccl_facts.arm_hang_warning(lib, host.machine)
        if hang:
            rows.append(
                Row(
                    "nccl library",
                    FAIL,
                    f"torch loads {lib.describe()}; {hang}",
                    "install NCCL 2.29.3 or later for torch (pip install -U nvidia-nccl-cu13), or point "
                    "ARXTUNE_NCCL_LIBRARY and LD_PRELOAD at the OS package's libnccl",
                    data,
                )
            )
        else:
            rows.append(Row("nccl library", OK, f"torch loads {lib.describe()}", data=data))
    bound = host.env.get("ARXTUNE_NCCL_LIBRARY", "").strip()
    if bound:
        lib = nccl_facts.library_info(bound)
        hang = nccl_facts.arm_hang_warning(lib, host.machine)
        rows.append(
            Row(
                "  ARXTUNE_NCCL_LIBRARY",
                FAIL if hang or lib.version is None else OK,
                f"the nccl backend binds {lib.describe()}" + (f"; {hang}" if hang else ""),
                "point it at NCCL 2.29.3 or later" if hang else ("not an NCCL library: fix or unset it" if lib.version is None else ""),
                {"path": lib.path, "version": lib.version, "build_id": lib.build_id},
            )
        )
    for path in others:
        if bound and path == Path(bound).resolve():
            continue
        lib = nccl_facts.library_info(path)
        hang = nccl_facts.arm_hang_warning(lib, host.machine)
        rows.append(
            Row(
                "  other libnccl",
                WARN if hang else INFO,
                f"{lib.describe()} on the library path" + (f"; {hang}" if hang else ""),
                "a program that loads it instead of torch's would hang" if hang else "",
                {"path": lib.path, "version": lib.version, "build_id": lib.build_id},
            )
        )
    return rows


def nccl_settings(host: Host) -> list[tuple[str, str, str]]:
    """(name, value, where) of every NCCL_* setting: the environment, then /etc/nccl.conf and ~/.nccl.conf."""
    found = [(k, v, "environment") for k, v in sorted(host.env.items()) if k.startswith("NCCL_")]
    for path in (host.etc / "nccl.conf", host.home / ".nccl.conf"):
        for line in (host.read(path) or "").splitlines():
            line = line.split("#")[0].strip()
            if "=" in line:
                name, _, value = line.partition("=")
                found.append((name.strip(), value.strip(), str(path)))
    return found


def check_nccl_env(host: Host) -> list[Row]:
    settings = nccl_settings(host)
    if not settings:
        return [Row("nccl settings", OK, "no NCCL_* variable set, no /etc/nccl.conf or ~/.nccl.conf", data={"settings": []})]
    derived = nccl_facts.pair_settings(endpoints(host)).values
    rows = []
    data = {"settings": [{"name": n, "value": v, "from": w} for n, v, w in settings]}
    rows.append(Row("nccl settings", INFO, "; ".join(f"{n}={v} ({w})" for n, v, w in settings), data=data))
    for name, value, where in settings:
        hurts, status, why = HURTING.get(name, (lambda v: False, OK, ""))
        if hurts(value):
            rows.append(Row(f"  {name}", status, f"{name}={value} ({where}): {why}", f"remove it from {where}"))
        elif name == "NCCL_IB_GID_INDEX" and "NCCL_IB_GID_INDEX" in derived and value.strip() != derived["NCCL_IB_GID_INDEX"]:
            rows.append(
                Row(
                    f"  {name}",
                    FAIL,
                    f"{name}={value} ({where}), but this box's RoCE v2 IPv4 GID is at index {derived['NCCL_IB_GID_INDEX']}",
                    f"export NCCL_IB_GID_INDEX={derived['NCCL_IB_GID_INDEX']} "
                    f"(it moves after reboots: derive it at launch, as `arxtune doctor` does)",
                )
            )
        elif name == "NCCL_IB_HCA" and "NCCL_IB_HCA" in derived:
            want = {h.split(":")[0] for h in derived["NCCL_IB_HCA"].lstrip("=").split(",")}
            named = {h.split(":")[0] for h in value.lstrip("=^").split(",") if h}
            if value.startswith("^") or not want <= named:
                rows.append(
                    Row(
                        f"  {name}",
                        WARN,
                        f"{name}={value} ({where}) leaves out {', '.join(sorted(want - named)) or 'twins'}",
                        f"export NCCL_IB_HCA={derived['NCCL_IB_HCA']} (both twins)",
                    )
                )
    return rows


def check_tuner_plugin(host: Host) -> list[Row]:
    """NCCL takes its tuner from the net plugin when NCCL_TUNER_PLUGIN is unset: one that carries tuner
    symbols then replaces NCCL's own choice, and arxtune's tuner, silently (FIELD-NOTES 11)."""
    if host.env.get("NCCL_TUNER_PLUGIN"):
        return [Row("nccl tuner plugin", OK, f"NCCL_TUNER_PLUGIN={host.env['NCCL_TUNER_PLUGIN']}", data={"set": True})]
    name = host.env.get("NCCL_NET_PLUGIN", "")
    patterns = [f"libnccl-net-{name}.so", name] if name else ["libnccl-net.so"]
    found = []
    for d in host.library_dirs():
        for pattern in patterns:
            candidate = d / pattern if "/" not in pattern else Path(pattern)
            if candidate.is_file() and candidate not in found:
                found.append(candidate)
    with_tuner = [p for p in found if b"ncclTunerPlugin_v" in (p.read_bytes() if p.stat().st_size < (512 << 20) else b"")]
    data = {"net_plugins": [str(p) for p in found], "with_tuner": [str(p) for p in with_tuner]}
    if with_tuner:
        return [
            Row(
                "nccl tuner plugin",
                FAIL,
                f"NCCL_TUNER_PLUGIN is unset and the net plugin {with_tuner[0]} carries tuner symbols: NCCL will take it as its tuner",
                "export NCCL_TUNER_PLUGIN=none (or arxtune's, `arxtune nccl-tuner build`) so NCCL's own choice, or yours, stands",
                data,
            )
        ]
    return [
        Row(
            "nccl tuner plugin",
            OK,
            "none: NCCL_TUNER_PLUGIN unset and no net plugin with tuner symbols" + (f" ({', '.join(map(str, found))})" if found else ""),
            data=data,
        )
    ]


def check_pair_settings(host: Host) -> list[Row]:
    settings = nccl_facts.pair_settings(endpoints(host))
    data = {"values": settings.values, "problem": settings.problem}
    if not settings.values:
        return [Row("nccl for the pair", INFO, f"nothing to derive: {settings.problem}", data=data)]
    lines = "; ".join(settings.export_lines())
    if settings.problem:
        return [Row("nccl for the pair", WARN, lines, settings.problem, data)]
    return [Row("nccl for the pair", OK, lines, data=data)]


# ---- the GPU, arxg, backends ------------------------------------------------------------------------------


def check_gpus(host: Host) -> list[Row]:
    """Integrated or not, pageable memory access, GPUDirect RDMA and dma-buf, as the driver says."""
    try:
        gpus = host.gpus.list()
    except Exception as exc:
        return [Row("gpus", WARN, f"cannot ask the driver: {exc}", "check the NVIDIA driver (nvidia-smi)")]
    if not gpus:
        return [Row("gpus", INFO, "none (torch.cuda.is_available() is False)", data={"gpus": []})]
    rows = []
    for g in gpus:
        yes = lambda k: {1: "yes", 0: "no", None: "unknown"}[g.get(k)]  # noqa: E731, B023 (used in this iteration)
        finding = (
            f"{g['name']} (sm_{g['capability'].replace('.', '')}), integrated {yes('integrated')}, pageable memory access "
            f"{yes('pageable_memory_access')} (host page tables {yes('host_page_tables')}), GPUDirect RDMA "
            f"{yes('gpu_direct_rdma')}, dma-buf {yes('dma_buf')}"
        )
        if g.get("integrated"):
            finding += ": on an integrated GPU (GB10) arx stages through host memory, so neither GPUDirect RDMA nor dma-buf is needed"
        rows.append(Row(f"gpu {g['index']}", OK, finding, data=g))
    return rows


def arxg_rows(reader=None, build=None) -> list[tuple[str, str]]:
    """How arxg's kernels reach host memory on each GPU, and which build of them GPU 0 loads (found on disk,
    or built here with Triton).

    `reader(ordinal)` reads the device's attributes and `build(variant, capability, source)` builds a kernel
    image (the real ones by default; tests pass fakes)."""
    import torch

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


def check_arxg(host: Host) -> list[Row]:
    rows = []
    for item, finding in arxg_rows():
        bad = finding.startswith(("unavailable", "cannot", "none for"))
        rows.append(
            Row(
                item,
                WARN if bad else (INFO if finding.startswith("not applicable") else OK),
                finding,
                "see docs/gb10.md, row arxg" if bad else "",
            )
        )
    return rows


def backend_reasons() -> dict[str, str | None]:
    """Why each backend cannot run here (None: it can), as its class says without a group; a backend whose class
    cannot tell (no `why_not_here`) is left out: a sweep under torchrun finds out."""
    from arxtune.runtime.backends import names, why_not_here

    reasons: dict[str, str | None] = {}
    for name in names():
        try:
            reasons[name] = why_not_here(name)
        except KeyError:
            continue
    return reasons


def check_backends(host: Host) -> list[Row]:
    from arxtune.runtime.backends import names

    reasons = backend_reasons()
    rows = []
    for name in names():
        if name not in reasons:
            rows.append(Row(f"backend {name}", INFO, "not checked here: run a sweep under torchrun to see"))
        elif reasons[name] is None:
            rows.append(Row(f"backend {name}", OK, "can run (under torchrun)"))
        else:
            rows.append(Row(f"backend {name}", INFO, f"cannot run: {reasons[name]}"))
    return rows


def check_settings(host: Host) -> list[Row]:
    return _config()[1]


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Host], list[Row]]


#: Every row of `arxtune doctor` on one box, in the order they print.
CHECKS: list[Check] = [
    Check("settings", check_settings),
    Check("pyverbs", check_pyverbs),
    Check("ports", check_ports),
    Check("twins", check_twins),
    Check("registration", check_registration),
    Check("memlock", check_memlock),
    Check("nccl library", check_nccl_library),
    Check("nccl settings", check_nccl_env),
    Check("nccl tuner plugin", check_tuner_plugin),
    Check("nccl for the pair", check_pair_settings),
    Check("gpus", check_gpus),
    Check("arxg", check_arxg),
    Check("backends", check_backends),
]


def run(host: Host | None = None, checks: list[Check] | None = None) -> list[Row]:
    """Every check's rows; a check that raises is its own FAIL row (doctor reports, it never stops half-way)."""
    host = host or Host()
    rows = []
    for check in checks or CHECKS:
        try:
            rows += check.run(host)
        except Exception as exc:
            rows.append(
                Row(
                    check.name,
                    FAIL,
                    f"the check itself failed: {type(exc).__name__}: {exc}",
                    "report it with `arxtune doctor --report FILE`",
                )
            )
    return rows
