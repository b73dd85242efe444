"""`arxtune doctor` across the boxes: one rank per box under torchrun, every rank's facts on rank 0.

Each rank runs the one-box checks and sums itself up (`rank_report`: versions, the
thresholds file in force, its twins with GID indexes and MTUs, where its rendezvous
traffic leaves from); rank 0 gathers them, then every pair of ranks ping-pongs RDMA
writes on each twin (pingpong.py). GROUP_CHECKS turn what was gathered into rows: one
function each over (reports, ping-pong results), so a new section is one more entry.
Every collective is bounded by the group's timeout, every wait in the ping-pong by
`timeout_s`: a rank that stops answering is named, never waited on forever.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import socket
import sys
from dataclasses import asdict, dataclass
from datetime import timedelta
from typing import Callable

from arxtune.harness.doctor import pingpong
from arxtune.harness.doctor.checks import endpoints, run as run_checks
from arxtune.harness.doctor.host import Host
from arxtune.harness.doctor.rows import FAIL, INFO, OK, WARN, Row, format_rows
from arxtune.runtime.rdma.device import read_devices


# ---- what each rank says about itself ---------------------------------------------------------------------


def _versions(host: Host) -> dict:
    from importlib import metadata

    import torch

    from arxtune import __version__
    from arxtune.harness.nccl_facts import library_info
    from arxtune.runtime.fingerprint import driver_version

    def dist_version(name):
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return None

    loaded = host.loaded_nccl()
    lib = library_info(loaded) if loaded else None
    return {
        "arxtune": __version__,
        "torch": torch.__version__,
        "nccl": lib.version if lib else None,
        "nccl build": lib.build_id[:16] if lib and lib.build_id else None,
        "triton": dist_version("triton"),
        "driver": driver_version(),
        "pyverbs": dist_version("pyverbs"),
        "python": sys.version.split()[0],
    }


def _thresholds() -> dict:
    from arxtune.runtime.dispatch import default_thresholds_path

    path = default_thresholds_path()
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        digest = None
    return {"path": str(path), "sha256": digest}


def _route(host: Host, master: str | None, port: int) -> dict:
    """The local address traffic to the rendezvous host leaves from, and its netdev (a UDP connect sends nothing)."""
    if not master:
        return {"master": None}
    try:
        family, _, _, _, addr = socket.getaddrinfo(master, port, socket.AF_INET, socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(addr)
            source = s.getsockname()[0]
    except OSError as exc:
        return {"master": master, "error": str(exc)}
    netdev = next((name for name, addrs in host.ipv4().items() for a in addrs if str(a.ip) == source), None)
    return {"master": master, "master_ip": addr[0], "source": source, "netdev": netdev}


def _reach(host: Host, rank: int) -> dict:
    """This rank's RDMA devices with their subnets and link state, as arx shares them at connect (reach.py)."""
    from arxtune.runtime.rdma import reach
    from arxtune.runtime.rdma.config import RdmaConfig

    addresses = {name: tuple((str(a.ip), a.network.prefixlen) for a in addrs) for name, addrs in host.ipv4().items()}
    try:
        return asdict(reach.local_facts(RdmaConfig.resolve(), rank, devices=read_devices(host.sysfs), addresses=addresses))
    except Exception as exc:  # no devices, a bad ARXTUNE_RDMA_* setting: the reason, shown in the matrix's section
        return {"error": " ".join(str(exc).split())}


def rank_report(host: Host, rank: int, rows: list[Row]) -> dict:
    """Everything rank 0 compares, as plain data (it crosses the group through gloo)."""
    ports = {(r.data.get("device"), r.data.get("port")): r.data for r in rows if r.data.get("gid_index") is not None}
    networks = host.ipv4()
    twins = []
    for ep in endpoints(host):
        facts = ports.get((ep.device, ep.port), {})
        twins.append(
            {
                "device": ep.device,
                "port": ep.port,
                "gid_index": ep.gid.index,
                "gid": ep.gid.gid,
                "ipv4": ep.gid.ipv4,
                "netdev": ep.gid.netdev,
                "active_mtu": facts.get("active_mtu"),
                "netdev_mtu": facts.get("netdev_mtu"),
                "networks": [str(a.network) for a in networks.get(ep.gid.netdev or "", [])],
            }
        )
    return {
        "rank": rank,
        "host": socket.gethostname(),
        "versions": _versions(host),
        "thresholds": _thresholds(),
        "twins": twins,
        "route": _route(host, host.env.get("MASTER_ADDR"), int(host.env.get("MASTER_PORT", "29500"))),
        "nccl_gid_index": host.env.get("NCCL_IB_GID_INDEX"),
        "reach": _reach(host, rank),
        "rows": [r.as_dict() for r in rows],
    }


# ---- the differences table --------------------------------------------------------------------------------

#: Table rows that differ by nature (each box has its own address): shown, never flagged.
PER_BOX = ("address", "rendezvous from")


def table(reports: list[dict]) -> list[tuple[str, list[str], bool | None]]:
    """(what, value per rank, differs; None where values are per box by nature) for every compared fact."""

    def facts(rep: dict) -> dict[str, str]:
        out = {f"{k}": str(v) for k, v in rep["versions"].items()}
        out["thresholds"] = f"{rep['thresholds']['path']} " + (rep["thresholds"]["sha256"] or "(absent)")[:16]
        out["rdma devices"] = ", ".join(t["device"] for t in rep["twins"]) or "none"
        for i, t in enumerate(rep["twins"]):
            out[f"twin {i} GID index"] = str(t["gid_index"])
            out[f"twin {i} MTU"] = f"active {t['active_mtu']}, {t['netdev']} {t['netdev_mtu']}"
            out[f"twin {i} address"] = f"{t['ipv4']} ({t['device']})"
        route = rep["route"]
        out["rendezvous from"] = (
            f"{route.get('source')} ({route.get('netdev') or '?'})" if route.get("source") else route.get("error") or "no MASTER_ADDR"
        )
        return out

    per_rank = [facts(r) for r in reports]
    keys = list(dict.fromkeys(k for f in per_rank for k in f))
    return [
        (k, [f.get(k, "-") for f in per_rank], None if k.endswith(PER_BOX) else len({f.get(k, "-") for f in per_rank}) > 1) for k in keys
    ]


def format_table(reports: list[dict], rows: list[tuple[str, list[str], bool | None]]) -> str:
    heads = [f"rank {r['rank']} ({r['host']})" for r in reports]
    cols = [max(len(h), *(len(vals[i]) for _, vals, _ in rows)) for i, h in enumerate(heads)]
    width = max(len("what"), *(len(k) for k, _, _ in rows))
    mark = {True: "DIFFERS", False: "same", None: ""}
    lines = ["  ".join(["what".ljust(width), *(h.ljust(c) for h, c in zip(heads, cols))]).rstrip()]
    for key, vals, differs in rows:
        lines.append("  ".join([key.ljust(width), *(v.ljust(c) for v, c in zip(vals, cols)), mark[differs]]).rstrip())
    return "\n".join(lines)


# ---- group checks: rows from what was gathered ------------------------------------------------------------

#: Version facts that must match across ranks (a mismatch makes a sweep fail or mislead), and those that should.
MUST_MATCH = ("arxtune", "torch", "nccl", "nccl build")
SHOULD_MATCH = ("triton", "driver", "pyverbs", "python")


def check_versions(reports: list[dict], pings: dict) -> list[Row]:
    rows = []
    for key in MUST_MATCH + SHOULD_MATCH:
        values = {r["rank"]: r["versions"].get(key) for r in reports}
        if len(set(values.values())) > 1:
            said = ", ".join(f"rank {k}: {v}" for k, v in values.items())
            must = key in MUST_MATCH
            rows.append(
                Row(
                    f"group {key}",
                    FAIL if must else WARN,
                    f"differs ({said})",
                    f"install the same {key} on every box"
                    + (
                        " (NCCL refuses or hangs across versions; two builds of one version behaved apart on Sparks)"
                        if key.startswith("nccl")
                        else ""
                    ),
                    {"ranks": list(values)},
                )
            )
    return rows or [Row("group versions", OK, "arxtune, torch, NCCL, Triton, driver and pyverbs the same on every rank")]


def check_thresholds(reports: list[dict], pings: dict) -> list[Row]:
    digests = {r["rank"]: r["thresholds"]["sha256"] for r in reports}
    if len(set(digests.values())) == 1:
        digest = next(iter(digests.values()))
        return [
            Row(
                "group thresholds",
                OK if digest else INFO,
                f"the same file on every rank ({digest[:16]})"
                if digest
                else "no thresholds file on any rank (a sweep and calibrate make one)",
            )
        ]
    said = ", ".join(f"rank {r['rank']}: {r['thresholds']['path']} {(r['thresholds']['sha256'] or 'absent')[:16]}" for r in reports)
    return [
        Row(
            "group thresholds",
            FAIL,
            f"the thresholds files differ ({said})",
            "copy one file to every box (arxtune calibrate ... --install, then the same file everywhere)",
            {"ranks": list(digests)},
        )
    ]


def check_twins(reports: list[dict], pings: dict) -> list[Row]:
    counts = {r["rank"]: len(r["twins"]) for r in reports}
    if not any(counts.values()):
        return [
            Row(
                "group rdma",
                WARN,
                "no rank has a usable RDMA device: arx cannot run; NCCL goes over sockets",
                "see each box's `arxtune doctor` rows for its RDMA devices",
            )
        ]
    rows = []
    if len(set(counts.values())) > 1:
        rows.append(
            Row(
                "group rdma",
                FAIL,
                f"usable twins per rank differ ({', '.join(f'rank {k}: {v}' for k, v in counts.items())})",
                "bring up the same twins on every box (each box's `arxtune doctor` names the one down)",
                {"ranks": list(counts)},
            )
        )
    for i in range(min(counts.values())):
        gids = {r["rank"]: r["twins"][i]["gid_index"] for r in reports}
        if len(set(gids.values())) > 1:
            pinned = all(r["nccl_gid_index"] == str(r["twins"][i]["gid_index"]) for r in reports)
            said = ", ".join(f"rank {k}: {v}" for k, v in gids.items())
            rows.append(
                Row(
                    f"group twin {i} GID index",
                    OK if pinned else FAIL,
                    f"differs ({said})" + ("; NCCL_IB_GID_INDEX is set to each box's own" if pinned else ""),
                    ""
                    if pinned
                    else "export each box's own NCCL_IB_GID_INDEX (the line its `arxtune doctor` prints; it "
                    "moves after a reboot, so derive it at launch) or leave it unset for NCCL's choice",
                    {"ranks": list(gids), "values": gids},
                )
            )
        mtus = {r["rank"]: (r["twins"][i]["active_mtu"], r["twins"][i]["netdev_mtu"]) for r in reports}
        if len({m[0] for m in mtus.values()}) > 1 or len({m[1] for m in mtus.values()}) > 1:
            said = ", ".join(f"rank {k}: active {a}, netdev {n}" for k, (a, n) in mtus.items())
            rows.append(
                Row(
                    f"group twin {i} MTU",
                    FAIL,
                    f"differs ({said}): the path MTU falls to the smaller",
                    "ip link set dev NETDEV mtu 9000 on every box (the same MTU end to end)",
                    {"ranks": list(mtus), "values": {k: list(v) for k, v in mtus.items()}},
                )
            )
    return rows or [Row("group rdma", OK, f"{min(counts.values())} twin(s) on every rank, same GID indexes and MTUs")]


def check_route(reports: list[dict], pings: dict) -> list[Row]:
    """The rendezvous (and NCCL's and gloo's own sockets with it) should leave over the ConnectX netdevs:
    a framework that advertised the Wi-Fi address hung TP on Sparks (FIELD-NOTES 11)."""
    rows = []
    for r in reports:
        route, twins = r["route"], r["twins"]
        if not route.get("source") or not twins:
            continue
        source = ipaddress.IPv4Address(route["source"])
        if source.is_loopback:
            continue
        inside = [t for t in twins if any(source in ipaddress.IPv4Network(n) for n in t["networks"])]
        if not inside:
            nets = ", ".join(f"{n} ({t['netdev']})" for t in twins for n in t["networks"]) or "none"
            rows.append(
                Row(
                    f"rank {r['rank']} rendezvous",
                    FAIL,
                    f"traffic to {route['master']} leaves from {source} ({route.get('netdev') or '?'}), outside the RDMA "
                    f"netdevs' subnets ({nets})",
                    f"use rank 0's ConnectX address as the rendezvous endpoint (MASTER_ADDR / --rdzv-endpoint), and "
                    f"GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME={twins[0]['netdev']}",
                    {"ranks": [r["rank"]]},
                )
            )
    return rows or [Row("group rendezvous", OK, "every rank reaches the rendezvous over an RDMA netdev's subnet (or locally)")]


def check_ranks(reports: list[dict], pings: dict) -> list[Row]:
    """Each rank's own failing rows, named by rank."""
    rows = []
    for r in reports:
        for row in r["rows"]:
            if row["status"] == FAIL:
                rows.append(Row(f"rank {r['rank']} {row['item'].strip()}", FAIL, row["finding"], row["fix"], {"ranks": [r["rank"]]}))
    return rows


def check_pairs(reports: list[dict], pings: dict) -> list[Row]:
    """The ping-pong figures of each pair on each twin; a twin that did not answer fails its pair."""
    rows = []
    for (i, j), twins in sorted(pings.items()):
        for twin, result in sorted(twins.items()):
            item = f"ping-pong {i}<->{j} {twin}"
            if "error" in result:
                rows.append(Row(item, FAIL, result["error"], "see both boxes' `arxtune doctor` rows for this device", {"ranks": [i, j]}))
            else:
                figures = ", ".join(f"{_size(int(s))} {us:.2f} us" for s, us in sorted(result["us"].items(), key=lambda kv: int(kv[0])))
                rows.append(Row(item, OK, f"RDMA write, half round trip (median): {figures}", data={"ranks": [i, j], **result}))
    return rows


def reach_group(reports: list[dict]) -> list:
    """Every rank's reach.RankFacts back from the gathered reports; raises ValueError naming a rank that has none."""
    from arxtune.runtime.rdma.reach import Address, DeviceFacts, RankFacts

    group = []
    for r in reports:
        facts = r.get("reach") or {"error": "not reported"}
        if "error" in facts:
            raise ValueError(f"rank {r['rank']}: {facts['error']}")
        devices = tuple(DeviceFacts(d["name"], d["state"], tuple(Address(**a) for a in d["addresses"])) for d in facts["devices"])
        group.append(RankFacts(facts["rank"], facts["host"], facts["boot"], devices))
    return group


def check_reach(reports: list[dict], pings: dict) -> list[Row]:
    """Which device of each rank reaches each peer (arx's rule at connect); a pair with none fails, naming both."""
    from arxtune.runtime.rdma import reach

    try:
        group = reach_group(reports)
    except ValueError as exc:
        return [Row("group reachability", WARN, f"not known: {exc}", "arx needs RDMA devices on every rank: see that rank's rows")]
    try:
        reach.check(group)
    except reach.Unreachable as exc:
        n = len(group)
        cut = sorted({r for a in range(n) for b in range(a + 1, n) if not reach.pair_links(group[a], group[b]) for r in (a, b)})
        return [
            Row(
                "group reachability",
                FAIL,
                str(exc).removeprefix("arx: "),
                "cable a port of each such pair into one subnet and bring it up, or set ARXTUNE_RDMA_DEVICES",
                {"ranks": cut, "matrix": reach.matrix(group)},
            )
        ]
    return [
        Row(
            "group reachability",
            OK,
            "every pair of ranks shares a subnet on a working device (matrix above)",
            data={"matrix": reach.matrix(group)},
        )
    ]


def _size(nbytes: int) -> str:
    return f"{nbytes >> 10} KiB" if nbytes >= 1024 else f"{nbytes} B"


@dataclass(frozen=True)
class GroupCheck:
    name: str
    run: Callable[[list[dict], dict], list[Row]]


#: Every section of the group doctor after the table, in print order.
GROUP_CHECKS: list[GroupCheck] = [
    GroupCheck("versions", check_versions),
    GroupCheck("thresholds", check_thresholds),
    GroupCheck("twins", check_twins),
    GroupCheck("rendezvous", check_route),
    GroupCheck("reachability", check_reach),
    GroupCheck("ranks", check_ranks),
    GroupCheck("ping-pong", check_pairs),
]


def verdicts(world: int, rows: list[Row]) -> list[Row]:
    """One line per pair of ranks: OK, or the failing rows that name either of them."""
    out = []
    for i in range(world):
        for j in range(i + 1, world):
            bad = [r for r in rows if r.status == FAIL and (not r.data.get("ranks") or {i, j} & set(r.data["ranks"]))]
            if bad:
                out.append(Row(f"verdict {i}<->{j}", FAIL, "; ".join(r.item for r in bad), "fix the rows above, then run doctor again"))
            else:
                warned = [r.item for r in rows if r.status == WARN]
                out.append(Row(f"verdict {i}<->{j}", OK, "ready for a sweep" + (f" (warnings: {', '.join(warned)})" if warned else "")))
    return out


def group_rows(reports: list[dict], pings: dict) -> list[Row]:
    rows = []
    for check in GROUP_CHECKS:
        try:
            rows += check.run(reports, pings)
        except Exception as exc:
            rows.append(Row(f"group {check.name}", FAIL, f"the check itself failed: {type(exc).__name__}: {exc}"))
    return rows + verdicts(len(reports), rows)


def reach_matrix_text(reports: list[dict]) -> str:
    """The reachability matrix as arx would see it at connect, or why it is not known."""
    from arxtune.runtime.rdma import reach

    try:
        return "reachability (devices of the row's rank that reach each peer):\n" + reach.render(reach_group(reports))
    except ValueError as exc:
        return f"reachability: not known ({exc})"


# ---- running it under torchrun ----------------------------------------------------------------------------


def _links(host: Host, rank: int, world: int) -> tuple[list, dict]:
    """This rank's twins and, per (peer, twin), an opened Link or the error that stopped it."""
    twins = endpoints(host)
    links: dict[tuple[int, int], object] = {}
    for peer in range(world):
        if peer == rank:
            continue
        for d, ep in enumerate(twins):
            try:
                links[(peer, d)] = pingpong.open_link(ep.device, ep.port, ep.gid.index, peer)
            except Exception as exc:
                links[(peer, d)] = f"cannot open {ep.device}: {type(exc).__name__}: {exc}"
    return twins, links


def ping_all(host: Host, rank: int, world: int, timeout_s: float, barrier: Callable[[], None], gather: Callable) -> dict:
    """Every pair ping-pongs on every twin both have; {(i, j): {twin name: {"us": {size: us}} or {"error": ...}}}."""
    try:
        twins, links = _links(host, rank, world)
    except Exception as exc:  # pyverbs missing: this rank still takes part in every exchange, with its reason
        twins, links = [], {}
        setup_error = f"rank {rank}: {type(exc).__name__}: {exc}"
    else:
        setup_error = None
    infos = {key: (link if isinstance(link, str) else link.info(twins[key[1]].gid.gid)) for key, link in links.items()}
    everyone = gather({"twins": [t.device for t in twins], "infos": infos, "error": setup_error})
    results: dict = {}
    try:
        for (peer, d), link in links.items():
            remote = everyone[peer]["infos"].get((rank, d))
            if not isinstance(link, str) and isinstance(remote, dict):
                try:
                    pingpong.connect(link, twins[d].port, remote)
                except Exception as exc:
                    links[(peer, d)] = f"cannot connect {twins[d].device} to rank {peer}: {exc}"
        barrier()
        for i in range(world):
            for j in range(i + 1, world):
                if rank in (i, j):
                    peer = j if rank == i else i
                    n = min(len(everyone[i]["twins"]), len(everyone[j]["twins"]))
                    for d in range(n):
                        name = everyone[i]["twins"][d] + (
                            f"/{everyone[j]['twins'][d]}" if everyone[j]["twins"][d] != everyone[i]["twins"][d] else ""
                        )
                        link, remote = links.get((peer, d)), everyone[peer]["infos"].get((rank, d))
                        if isinstance(link, str) or not isinstance(remote, dict):
                            results.setdefault((i, j), {})[name] = {
                                "error": link if isinstance(link, str) else (remote or f"rank {peer} has no twin {d}")
                            }
                            continue
                        try:
                            us = pingpong.run(link, remote, rank == i, timeout_s)
                            if rank == i:
                                results.setdefault((i, j), {})[name] = {"us": {str(k): v for k, v in us.items()}}
                        except Exception as exc:
                            results.setdefault((i, j), {})[name] = {"error": f"rank {rank}: {exc}"}
                barrier()
    finally:
        for link in links.values():
            if not isinstance(link, str):
                link.close()
    merged: dict = {}
    for part in gather(results):  # the initiator's figures, unless either side saw an error
        for pair, by_twin in part.items():
            for name, result in by_twin.items():
                if name not in merged.setdefault(pair, {}) or "error" in result:
                    merged[pair][name] = result
    return merged


def run_group(timeout_s: float = 60.0, host: Host | None = None, say=print) -> tuple[int, list[Row], list[dict], dict]:
    """Under torchrun: every rank checks itself, rank 0 prints the table and the verdicts.

    Returns (exit code, group rows, reports, ping-pong results); only rank 0's are filled."""
    import torch.distributed as dist

    from arxtune.harness.launch import JOINED_LINE, tell_launcher

    host = host or Host()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    timeout = timedelta(seconds=timeout_s)
    stage = "the rendezvous"

    def gather(obj):
        out = [None] * world
        dist.all_gather_object(out, obj)
        return out

    def barrier():
        dist.monitored_barrier(timeout=timeout, wait_all_ranks=True)

    rows = reports = pings = None
    try:
        dist.init_process_group("gloo", timeout=timeout)
        tell_launcher(JOINED_LINE)
        stage = "the reports"
        rows = run_checks(host)
        barrier()
        reports = gather(rank_report(host, rank, rows))
        stage = "the ping-pong"
        pings = ping_all(host, rank, world, timeout_s, barrier, gather)
        if rank == 0:
            rows = group_rows(reports, pings)
            say(format_table(reports, table(reports)))
            say("")
            say(reach_matrix_text(reports))
            say("")
            say(format_rows(rows))
        stage = "the verdict"
        # Every rank leaves with the group's code, so torchrun fails (or not) on every box alike; the others say where to look.
        failing = [r.item for r in rows if r.status == FAIL] if rank == 0 else None
        failing = gather(failing)[0]
        if rank != 0:
            say(
                f"doctor: rank {rank}: the table and the verdicts are on rank 0 ({reports[0]['host']}): "
                + (f"{len(failing)} failing row(s): {', '.join(failing)}" if failing else "every pair ready for a sweep")
            )
        code = int(bool(failing))
    except Exception as exc:  # a rank that died or froze: the collective's timeout names it, nothing waits further
        said = " ".join(str(exc).split())
        say(f"doctor: rank {rank}: the group stopped answering during {stage} within {timeout_s:g} s: {said[:400]}")
        return (
            1,
            [
                Row(
                    "group",
                    FAIL,
                    f"no answer during {stage}: {said[:300]}",
                    "check that every box runs the same "
                    "command and reaches the rendezvous; rerun with a larger --timeout-s under emulation",
                )
            ],
            reports or [],
            pings or {},
        )
    finally:
        try:
            dist.destroy_process_group()
        except Exception:
            pass
    if rank != 0:
        return code, [], [], {}
    return code, rows, reports, pings
