"""Checks what scripts/rdma_lab/doctor-cases.sh left behind (the group doctor in the two-guest lab).

    python tests/rdma/device/doctor_cases_check.py OUT_DIR

Healthy: exit 0 on both guests, every pair's verdict ok, ping-pong figures present and positive on
both rails. GID index made to differ: exit 1 and the twin's GID index row FAIL, naming both ranks'
indexes. MTU mismatch: exit 1 and the twin's MTU row FAIL. Prints rank 0's table for each case and
the ping-pong figures beside floor.sh's (perftest) for the same guests. Exits 1 on any miss.
"""

from __future__ import annotations

import json
import sys
import tarfile
from pathlib import Path


def report(out: Path, case: str) -> dict:
    with tarfile.open(out / f"{case}.tgz") as tar:
        return json.load(tar.extractfile("arxtune-doctor/doctor.json"))


def rows(doc: dict) -> dict[str, dict]:
    return {r["item"]: r for r in doc["group"]["rows"]}


def main(out: Path) -> int:
    misses = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            misses.append(what)

    for case in ("healthy", "gid", "mtu"):
        print(f"==== {case}: rank 0's output")
        print((out / f"{case}.node0.txt").read_text(errors="replace"))
        codes = [int((out / f"{case}.node{n}.rc").read_text()) for n in (0, 1)]
        print(f"==== {case}: exit codes {codes}")
        doc = report(out, case)
        got = rows(doc)
        if case == "healthy":
            need(codes == [0, 0], f"healthy: exit codes {codes}, want [0, 0]")
            need(got.get("verdict 0<->1", {}).get("status") == "ok", "healthy: verdict 0<->1 is not ok")
            pings = [r for k, r in got.items() if k.startswith("ping-pong 0<->1")]
            need(len(pings) == 2, f"healthy: {len(pings)} ping-pong rows, want one per rail (2)")
            for r in pings:
                us = r["data"].get("us", {})
                need(set(us) == {"2", "16384"} and all(v > 0 for v in us.values()), f"healthy: {r['item']}: figures {us}")
        elif case == "gid":
            need(codes == [1, 1], f"gid: exit codes {codes}, want [1, 1]")
            row = got.get("group twin 0 GID index", {})
            need(
                row.get("status") == "fail" and "rank 0: 1" in row.get("finding", "") and "rank 1: 2" in row.get("finding", ""),
                f"gid: the GID index row is {row}",
            )
            need(got.get("verdict 0<->1", {}).get("status") == "fail", "gid: verdict is not fail")
        else:
            need(codes == [1, 1], f"mtu: exit codes {codes}, want [1, 1]")
            row = got.get("group twin 0 MTU", {})
            need(
                row.get("status") == "fail" and "4096" in row.get("finding", "") and "1024" in row.get("finding", ""),
                f"mtu: the MTU row is {row}",
            )
    healthy = rows(report(out, "healthy"))
    print("==== ping-pong (doctor, pyverbs, healthy case) beside floor.sh (perftest ib_write_lat t_typical)")
    floor = {}
    for line in (out / "floor.node1.txt").read_text().splitlines():
        dev, _, kv = line.partition(" ")
        key, _, value = kv.partition("=")
        floor[(dev, key.removeprefix("ib_write_lat_").removesuffix("_us"))] = value
    for item, r in sorted(healthy.items()):
        if item.startswith("ping-pong"):
            dev = item.split()[-1]
            for size, us in sorted(r["data"]["us"].items(), key=lambda kv: int(kv[0])):
                print(f"{dev} {size:>5} B: doctor {us:9.2f} us   floor.sh {floor.get((dev, f'{size}B'), '?'):>9} us")
    need(len(floor) == 4, f"floor.sh gave {len(floor)} figures, want 4")
    for miss in misses:
        print(f"MISS: {miss}")
    print("doctor cases: " + ("PASS" if not misses else "FAIL"))
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
