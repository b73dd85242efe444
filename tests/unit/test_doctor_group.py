"""The group doctor's sections (GROUP_CHECKS) and verdicts on gathered reports, without a group."""

from __future__ import annotations

import copy

from arxtune.harness.doctor import group
from arxtune.harness.doctor.rows import FAIL, OK, WARN, format_rows


def report(rank: int, gid: int = 3, mtu: tuple = (4096, 9000), source: str = "10.0.0.2", **versions) -> dict:
    base = {
        "arxtune": "0.1.0",
        "torch": "2.11.0",
        "nccl": "2.29.3+cuda13.0",
        "nccl build": "ab12",
        "triton": "3.6.0",
        "driver": "580.95.05",
        "pyverbs": "59.0+bundled.1",
        "python": "3.12.3",
    }
    return {
        "rank": rank,
        "host": f"spark{rank}",
        "versions": {**base, **versions},
        "thresholds": {"path": "/etc/arxtune/thresholds.json", "sha256": "f" * 64},
        "twins": [
            {
                "device": "rocep1s0f1",
                "port": 1,
                "gid_index": gid,
                "gid": "",
                "ipv4": f"10.0.0.{rank + 1}",
                "netdev": "enp1s0f1np1",
                "active_mtu": mtu[0],
                "netdev_mtu": mtu[1],
                "networks": ["10.0.0.0/24"],
            },
            {
                "device": "roceP2p1s0f1",
                "port": 1,
                "gid_index": gid,
                "gid": "",
                "ipv4": f"10.0.1.{rank + 1}",
                "netdev": "enP2p1s0f1np1",
                "active_mtu": 4096,
                "netdev_mtu": 9000,
                "networks": ["10.0.1.0/24"],
            },
        ],
        "route": {"master": "spark0", "source": source, "netdev": "enp1s0f1np1"},
        "nccl_gid_index": None,
        "reach": reach(rank, [("rocep1s0f1", f"10.0.0.{rank + 1}", 24), ("roceP2p1s0f1", f"10.0.1.{rank + 1}", 24)]),
        "rows": [],
    }


def reach(rank: int, devices: list[tuple[str, str, int]], state: str = "ACTIVE") -> dict:
    """A rank's reachability facts as the report carries them: (device, IPv4, prefix) each."""
    return {
        "rank": rank,
        "host": f"spark{rank}",
        "boot": f"boot{rank}",
        "devices": [
            {"name": name, "state": state, "addresses": [{"ip": ip, "prefix": prefix, "gid_index": 3, "gid": ""}]}
            for name, ip, prefix in devices
        ],
    }


PINGS = {(0, 1): {"rocep1s0f1": {"us": {"2": 1.6, "16384": 2.9}}, "roceP2p1s0f1": {"us": {"2": 1.7, "16384": 3.0}}}}


def by_item(rows):
    return {r.item: r for r in rows}


def test_a_healthy_pair():
    rows = group.group_rows([report(0, source="10.0.0.1"), report(1)], PINGS)
    assert not [r for r in rows if r.status == FAIL], format_rows(rows)
    got = by_item(rows)
    assert got["verdict 0<->1"].status == OK
    assert got["ping-pong 0<->1 rocep1s0f1"].finding == "RDMA write, half round trip (median): 2 B 1.60 us, 16 KiB 2.90 us"
    table = group.table([report(0), report(1)])
    assert not any(differs for _, _, differs in table)
    assert ("twin 0 address", ["10.0.0.1 (rocep1s0f1)", "10.0.0.2 (rocep1s0f1)"], None) in table
    text = group.format_table([report(0), report(1)], table)
    assert text.splitlines()[0].split() == ["what", "rank", "0", "(spark0)", "rank", "1", "(spark1)"]


def test_gid_index_that_differs_fails_unless_each_box_pins_its_own():
    reports = [report(0, gid=3), report(1, gid=4)]
    row = by_item(group.group_rows(reports, PINGS))["group twin 0 GID index"]
    assert row.status == FAIL and "rank 0: 3, rank 1: 4" in row.finding and "NCCL_IB_GID_INDEX" in row.fix
    assert ("twin 0 GID index", ["3", "4"], True) in group.table(reports)
    for r in reports:
        r["nccl_gid_index"] = str(r["twins"][0]["gid_index"])
    assert by_item(group.group_rows(reports, PINGS))["group twin 0 GID index"].status == OK


def test_mtu_mismatch_fails_the_pair():
    rows = by_item(group.group_rows([report(0), report(1, mtu=(1024, 1500))], PINGS))
    assert rows["group twin 0 MTU"].status == FAIL and "active 1024, netdev 1500" in rows["group twin 0 MTU"].finding
    assert rows["verdict 0<->1"].status == FAIL and "group twin 0 MTU" in rows["verdict 0<->1"].finding


def test_versions_that_must_match_fail_and_others_warn():
    rows = by_item(group.check_versions([report(0), report(1, **{"nccl build": "cd34", "triton": "3.5.0"})], {}))  # type: ignore[arg-type]
    assert rows["group nccl build"].status == FAIL and "two builds" in rows["group nccl build"].fix
    assert rows["group triton"].status == WARN


def test_thresholds_files_that_differ_fail():
    a, b = report(0), report(1)
    b["thresholds"] = {"path": "/home/me/.config/arxtune/thresholds.json", "sha256": None}
    row = group.check_thresholds([a, b], {})[0]
    assert row.status == FAIL and "copy one file" in row.fix


def test_rendezvous_over_wifi_is_named():
    row = group.check_route([report(0, source="10.0.0.1"), report(1, source="192.168.1.20")], {})[0]
    assert row.item == "rank 1 rendezvous" and row.status == FAIL and "192.168.1.20" in row.finding
    assert "GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME=enp1s0f1np1" in row.fix


def test_a_silent_peer_on_one_twin_fails_its_pair_only():
    pings = copy.deepcopy(PINGS)
    pings[(0, 1)]["roceP2p1s0f1"] = {"error": "rank 1 sent nothing on roceP2p1s0f1 within 10 s"}  # type: ignore[dict-item]
    rows = by_item(group.group_rows([report(0), report(1)], pings))
    assert rows["ping-pong 0<->1 roceP2p1s0f1"].status == FAIL
    assert rows["verdict 0<->1"].status == FAIL


def test_a_ranks_own_failure_is_carried_to_the_verdicts_of_its_pairs():
    reports = [report(0), report(1), report(2)]
    reports[2]["rows"] = [{"item": "nccl library", "status": "fail", "finding": "NCCL 2.28.9 on aarch64", "fix": "upgrade", "data": {}}]
    rows = by_item(group.group_rows(reports, {}))
    assert rows["rank 2 nccl library"].status == FAIL
    assert rows["verdict 0<->1"].status == OK
    assert rows["verdict 0<->2"].status == FAIL and rows["verdict 1<->2"].status == FAIL


def test_the_sections_are_a_list_a_new_one_joins():
    names = [c.name for c in group.GROUP_CHECKS]
    assert names == ["versions", "thresholds", "twins", "rendezvous", "reachability", "ranks", "ping-pong"]


def test_reachability_matrix_of_a_pair_and_of_a_ring_of_three():
    rows = by_item(group.group_rows([report(0), report(1)], PINGS))
    assert rows["group reachability"].status == OK
    text = group.reach_matrix_text([report(0), report(1)])
    assert text.splitlines()[3].split()[-2:] == ["rocep1s0f1+roceP2p1s0f1", "self"], text
    ring = [report(r) for r in range(3)]  # each box's two ports cabled to its two neighbours, one subnet per cable
    cables = {
        0: [("rxe0", "10.77.30.1", 24), ("rxe1", "10.77.32.2", 24)],
        1: [("rxe0", "10.77.31.1", 24), ("rxe1", "10.77.30.2", 24)],
        2: [("rxe0", "10.77.32.1", 24), ("rxe1", "10.77.31.2", 24)],
    }
    for r in ring:
        r["reach"] = reach(r["rank"], cables[r["rank"]])
    assert by_item(group.check_reach(ring, {}))["group reachability"].status == OK
    lines = group.reach_matrix_text(ring).splitlines()
    assert lines[2].split()[-3:] == ["self", "rxe0", "rxe1"] and lines[3].split()[-3:] == ["rxe1", "self", "rxe0"], lines


def test_a_pair_without_a_shared_subnet_fails_naming_both_ranks():
    reports = [report(r) for r in range(3)]
    reports[2]["reach"] = reach(2, [("rocep1s0f1", "192.168.7.3", 24)])
    rows = by_item(group.group_rows(reports, {}))
    row = rows["group reachability"]
    assert row.status == FAIL and "rank 0 and rank 2, rank 1 and rank 2" in row.finding and "ARXTUNE_RDMA_DEVICES" in row.fix
    assert rows["verdict 0<->2"].status == FAIL and "group reachability" in rows["verdict 0<->2"].finding
    assert group.reach_matrix_text(reports).splitlines()[-1].split()[-3:] == ["-", "-", "self"]


def test_a_rank_without_devices_makes_reachability_unknown_not_a_crash():
    reports = [report(0), report(1)]
    reports[1]["reach"] = {"error": "arx: no RDMA devices (/sys/class/infiniband is empty; load rdma_rxe or a NIC driver)"}
    row = by_item(group.check_reach(reports, {}))["group reachability"]
    assert row.status == WARN and "rank 1: arx: no RDMA devices" in row.finding
    assert group.reach_matrix_text(reports).startswith("reachability: not known (rank 1: arx: no RDMA devices")
