"""Pure tests: which device reaches which peer (reach.py) on fake device lists, and the facts it reads."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time

import pytest

from arxtune.runtime.rdma import reach
from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.connection import open_transport, share_facts
from arxtune.runtime.rdma.device import ipv4_addresses, parse_address_dump, read_devices
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.reach import Address, DeviceFacts, RankFacts, Unreachable

from test_device import make_dev, v4


def gid_of(ip: str) -> str:
    return str(ipaddress.IPv6Address(f"::ffff:{ip}").exploded)


def dev(name: str, *cidrs: str, state: str = "ACTIVE") -> DeviceFacts:
    """A device whose GID i+1 carries the i-th address (GID 0 is the link-local one, as on rxe and mlx5)."""
    addrs = tuple(Address(c.split("/")[0], int(c.split("/")[1]), i + 1, gid_of(c.split("/")[0])) for i, c in enumerate(cidrs))
    return DeviceFacts(name, state, addrs)


def rank(r: int, *devices: DeviceFacts, boot: str | None = None) -> RankFacts:
    return RankFacts(r, f"box{r}", boot or f"boot{r}", tuple(devices))


def ring_of_three() -> list[RankFacts]:
    """Three boxes, port a of each cabled to port b of the next, one subnet per cable."""
    return [rank(r, dev("a", f"10.9.{r}.1/24"), dev("b", f"10.9.{(r - 1) % 3}.2/24")) for r in range(3)]


def local_names(links) -> list[str]:
    return [link.local for link in links]


def test_ring_of_three_reaches_each_neighbour_through_its_own_port_only():
    group = ring_of_three()
    for r in range(3):
        got = reach.routes(group, r)
        assert local_names(got[(r + 1) % 3]) == ["a"] and local_names(got[(r - 1) % 3]) == ["b"]
        nxt = got[(r + 1) % 3][0]
        assert (nxt.remote, nxt.subnet, nxt.sgid_index, nxt.dgid) == ("b", f"10.9.{r}.0/24", 1, gid_of(f"10.9.{r}.2"))
    assert reach.narrowest(group) == reach.widest(group) == 1
    assert [row[3:] for row in reach.matrix(group)[1:]] == [["self", "a", "b"], ["b", "self", "a"], ["a", "b", "self"]]


def test_spark_ring_stripes_each_neighbour_over_the_twins_of_one_port():
    """NVIDIA's layout: each twin of a cabled port in a subnet of its own; port 1 to the next box, port 2 to the previous."""

    def box(r):
        nxt, prv = r, (r - 1) % 3
        return rank(
            r,
            dev("rocep1s0f1", f"192.168.{10 * nxt}.{r + 1}/24"),
            dev("roceP2p1s0f1", f"192.168.{10 * nxt + 1}.{r + 1}/24"),
            dev("rocep1s0f0", f"192.168.{10 * prv}.{r + 1}/24"),
            dev("roceP2p1s0f0", f"192.168.{10 * prv + 1}.{r + 1}/24"),
        )

    group = [box(r) for r in range(3)]
    got = reach.routes(group, 1)
    assert [(link.local, link.remote) for link in got[2]] == [("rocep1s0f1", "rocep1s0f0"), ("roceP2p1s0f1", "roceP2p1s0f0")]
    assert [(link.local, link.remote) for link in got[0]] == [("rocep1s0f0", "rocep1s0f1"), ("roceP2p1s0f0", "roceP2p1s0f1")]
    assert reach.narrowest(group) == 2


def test_switch_pairs_twins_in_one_subnet_one_to_one_in_the_same_order_on_both_sides():
    group = [rank(r, dev("t0", f"10.8.0.{2 * r + 1}/24"), dev("t1", f"10.8.0.{2 * r + 2}/24")) for r in range(4)]
    for r in range(4):
        for peer, links in reach.routes(group, r).items():
            assert [(link.local, link.remote) for link in links] == [("t0", "t0"), ("t1", "t1")], (r, peer)
            back = reach.routes(group, peer)[r]
            assert [(link.remote, link.local) for link in back] == [(link.local, link.remote) for link in links]
    assert reach.narrowest(group) == reach.widest(group) == 2


def test_one_twin_down_leaves_its_pairs_one_link_and_the_rest_two():
    group = [
        rank(r, dev("t0", f"10.8.0.{2 * r + 1}/24"), dev("t1", f"10.8.0.{2 * r + 2}/24", state="DOWN" if r == 2 else "ACTIVE"))
        for r in range(3)
    ]
    assert local_names(reach.routes(group, 0)[1]) == ["t0", "t1"]
    assert local_names(reach.routes(group, 0)[2]) == ["t0"]
    assert [link.remote for link in reach.routes(group, 0)[2]] == ["t0"]
    assert local_names(reach.routes(group, 2)[1]) == ["t0"]
    assert (reach.narrowest(group), reach.widest(group)) == (1, 2)
    assert [len(v) for v in reach.routes(group, 0, width=1).values()] == [1, 1]  # the graph engine's uniform width
    assert "(DOWN)" in reach.render(group)


def test_no_route_is_one_error_naming_both_ranks_and_their_subnets_on_every_rank():
    group = ring_of_three()
    group[2] = rank(2, dev("a", "10.9.8.1/24"), dev("b", "10.9.1.2/24", state="DOWN"))  # cabled elsewhere, and down
    messages = set()
    for r in range(3):
        with pytest.raises(Unreachable) as info:
            reach.routes(group, r)
        messages.add(str(info.value))
    (msg,) = messages
    assert "rank 0 and rank 2" in msg and "rank 1 and rank 2" in msg and "rank 0 and rank 1" not in msg
    assert "10.9.0.1/24" in msg and "10.9.8.1/24" in msg and "10.9.1.2/24 (DOWN)" in msg and "rank 1 (box1)" in msg
    assert "\n" not in msg
    assert [row[3:] for row in reach.matrix(group)[1:]] == [["self", "a", "-"], ["b", "self", "-"], ["-", "-", "self"]]


def test_a_device_with_several_addresses_uses_the_gid_of_the_shared_subnet():
    group = [rank(0, dev("m", "172.16.0.1/16", "10.1.0.1/24")), rank(1, dev("n", "10.1.0.2/24"))]
    (link,) = reach.routes(group, 0)[1]
    assert (link.sgid_index, link.dgid, link.subnet) == (2, gid_of("10.1.0.2"), "10.1.0.0/24")
    (back,) = reach.routes(group, 1)[0]
    assert (back.sgid_index, back.dgid) == (1, gid_of("10.1.0.1"))


def test_loopback_and_one_address_link_only_ranks_on_one_host():
    lo = dev("rxe_lo", "127.0.0.1/8")
    with pytest.raises(Unreachable):
        reach.routes([rank(0, lo), rank(1, lo)], 0)
    assert local_names(reach.routes([rank(0, lo, boot="k"), rank(1, lo, boot="k")], 0)[1]) == ["rxe_lo"]
    same = dev("d", "10.0.0.1/24")
    with pytest.raises(Unreachable):
        reach.routes([rank(0, same), rank(1, same)], 0)  # one address on two hosts: a misconfiguration, not a link


def test_both_sides_must_agree_on_the_subnet():
    with pytest.raises(Unreachable):  # 10.0.0.9 is in 10.0.0.0/16, but 10.0.1.1 is not in 10.0.0.0/24
        reach.routes([rank(0, dev("a", "10.0.1.1/16")), rank(1, dev("b", "10.0.0.9/24"))], 0)


def test_links_are_as_many_as_a_one_to_one_pairing_allows():
    """Greedy would pair x with q (its first choice) and leave y without a partner; x moves to p instead."""
    a = rank(0, dev("x", "10.1.0.1/24", "10.2.0.1/24"), dev("y", "10.2.0.2/24"))
    b = rank(1, dev("p", "10.1.0.9/24"), dev("q", "10.2.0.9/24"))
    assert {(link.local, link.remote) for link in reach.routes([a, b], 0)[1]} == {("x", "p"), ("y", "q")}


def test_render_is_one_aligned_line_per_rank():
    text = reach.render(ring_of_three())
    lines = text.splitlines()
    assert lines[0].split() == ["rank", "host", "devices", "to", "0", "to", "1", "to", "2"]
    assert lines[1].startswith("0") and "a 10.9.0.1/24, b 10.9.2.2/24" in lines[1] and lines[1].endswith("self  a     b")
    assert len({line.index("to 0") for line in lines[:1]}) == 1 and len(lines) == 4


# ---- facts read on a fake sysfs tree ------------------------------------------------------
def fake_tree(tmp_path):
    make_dev(
        tmp_path,
        "rxe0",
        [
            ("fe80:0000:0000:0000:5054:00ff:fe12:3456", "RoCE v2", "eth0"),
            (v4(10, 77, 1, 1), "IB/RoCE v1", "eth0"),
            (v4(10, 77, 1, 1), "RoCE v2", "eth0"),
            (v4(10, 99, 0, 1), "RoCE v2", "eth0"),
        ],
    )  # a GID whose address left the netdev
    make_dev(tmp_path, "rxe1", [(v4(10, 77, 2, 1), "RoCE v2", "eth1")], state="1: DOWN")
    make_dev(tmp_path, "ib0", [(v4(10, 5, 0, 1), "RoCE v2", "ib0")], link_layer="InfiniBand")
    return read_devices(tmp_path)


ADDRS = {"eth0": (("10.77.1.1", 24), ("192.168.0.7", 16)), "eth1": (("10.77.2.1", 24),), "lo": (("127.0.0.1", 8),)}


def test_local_facts_take_every_ethernet_device_with_state_and_prefixes(tmp_path):
    facts = reach.local_facts(RdmaConfig(), 3, fake_tree(tmp_path), ADDRS, boot="b", host="h")
    assert (facts.rank, facts.host, facts.boot) == (3, "h", "b")
    assert [str(d) for d in facts.devices] == ["rxe0 10.77.1.1/24", "rxe1 10.77.2.1/24 (DOWN)"]
    assert facts.devices[0].addresses[0].gid_index == 2


def test_local_facts_of_named_devices_and_their_errors(tmp_path):
    devices = fake_tree(tmp_path)
    facts = reach.local_facts(RdmaConfig(devices=("rxe1",)), 0, devices, ADDRS, boot="b", host="h")
    assert [d.name for d in facts.devices] == ["rxe1"]
    with pytest.raises(RdmaUnavailable, match="nope not found; present: ib0, rxe0, rxe1"):
        reach.local_facts(RdmaConfig(devices=("nope",)), 0, devices, ADDRS)
    with pytest.raises(RdmaUnavailable, match="InfiniBand, not Ethernet"):
        reach.local_facts(RdmaConfig(devices=("ib0",)), 0, devices, ADDRS)
    with pytest.raises(RdmaUnavailable, match="has RoCE v2 GID fe80.* at index 0; arx needs .* IPv4"):
        reach.local_facts(RdmaConfig(devices=("rxe0",), gid_index=0), 0, devices, ADDRS)
    pinned = reach.local_facts(RdmaConfig(devices=("rxe0",), gid_index=2), 0, devices, ADDRS, boot="b", host="h")
    assert [a.gid_index for a in pinned.devices[0].addresses] == [2]
    with pytest.raises(RdmaUnavailable, match="no RDMA devices"):
        reach.local_facts(RdmaConfig(), 0, [], ADDRS)


def test_ipv4_addresses_come_from_the_kernel():
    assert ("127.0.0.1", 8) in ipv4_addresses()["lo"]


def test_the_address_dump_parser_keeps_every_address_of_an_interface():
    def message(index, ip, prefix, local=True):
        attr_type = 2 if local else 1
        attrs = struct.pack("=HH", 8, attr_type) + socket.inet_aton(ip)
        body = struct.pack("=BBBBI", socket.AF_INET, prefix, 0, 0, index) + attrs
        return struct.pack("=IHHII", 16 + len(body), 20, 2, 1, 0) + body

    data = message(3, "10.0.0.1", 24) + message(3, "10.0.1.1", 25, local=False) + struct.pack("=IHHII", 20, 3, 2, 1, 0) + b"\0" * 4
    assert parse_address_dump(data) == ([(3, "10.0.0.1", 24), (3, "10.0.1.1", 25)], True)
    error = struct.pack("=IHHII", 36, 2, 0, 1, 0) + struct.pack("=i", -1) + b"\0" * 16
    with pytest.raises(OSError, match="netlink"):
        parse_address_dump(error)


# ---- at connect -------------------------------------------------------------------------
def exchanges(world: int):
    from arxtune.runtime.rdma.graph.session import local_exchanges

    return local_exchanges(world)


def run_ranks(world: int, fn):
    results: dict[int, object] = {}

    def one(r):
        try:
            results[r] = fn(r)
        except Exception as exc:  # collected per rank
            results[r] = exc

    threads = [threading.Thread(target=one, args=(r,), daemon=True) for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(not t.is_alive() for t in threads), "a rank hung"
    return results


def test_an_unreachable_peer_stops_every_rank_at_connect_before_any_queue_pair():
    group = ring_of_three()
    group[1] = rank(1, dev("a", "10.9.5.1/24"), dev("b", "10.9.6.2/24"))
    ex = exchanges(3)
    t0 = time.monotonic()
    results = run_ranks(3, lambda r: open_transport(RdmaConfig(), r, 3, ex[r], facts=group[r]))
    assert time.monotonic() - t0 < 5
    assert all(isinstance(e, Unreachable) for e in results.values()), results
    assert len({str(e) for e in results.values()}) == 1 and "rank 0 and rank 1, rank 1 and rank 2" in str(results[0])


def test_a_rank_that_cannot_read_its_devices_is_every_ranks_error():
    ex = exchanges(2)
    cfg = RdmaConfig(devices=("nope",))
    results = run_ranks(2, lambda r: share_facts(cfg, r, ex[r], ring_of_three()[0] if r == 0 else None))
    assert all(isinstance(e, RdmaUnavailable) and str(e).startswith("rank 1: arx: ") for e in results.values()), results
    assert str(results[0]) == str(results[1])
