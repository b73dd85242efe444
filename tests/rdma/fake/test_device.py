"""Pure tests: device discovery and GID selection on a fake sysfs tree."""

from __future__ import annotations

import pytest

from arxtune.runtime.rdma.config import RdmaConfig
from arxtune.runtime.rdma.device import read_devices, select_endpoints, select_gid
from arxtune.runtime.rdma.errors import RdmaUnavailable

V4 = "0000:0000:0000:0000:0000:ffff:{:02x}{:02x}:{:02x}{:02x}"


def v4(a, b, c, d):
    return V4.format(a, b, c, d)


LINK_LOCAL = "fe80:0000:0000:0000:5054:00ff:fe12:3456"


def make_dev(root, name, gids, state="4: ACTIVE", link_layer="Ethernet", port=1, empty_slots=2):
    """gids: list of (gid, type, netdev). Also writes zeroed, unreadable-type slots like the kernel."""
    pdir = root / name / "ports" / str(port)
    for sub in ("gids", "gid_attrs/types", "gid_attrs/ndevs"):
        (pdir / sub).mkdir(parents=True, exist_ok=True)
    (pdir / "state").write_text(state + "\n")
    (pdir / "link_layer").write_text(link_layer + "\n")
    for i, (gid, kind, ndev) in enumerate(gids):
        (pdir / "gids" / str(i)).write_text(gid + "\n")
        (pdir / "gid_attrs/types" / str(i)).write_text(kind + "\n")
        (pdir / "gid_attrs/ndevs" / str(i)).write_text(ndev + "\n")
    for j in range(len(gids), len(gids) + empty_slots):
        (pdir / "gids" / str(j)).write_text("0000:0000:0000:0000:0000:0000:0000:0000\n")


def test_picks_roce_v2_gid_carrying_the_ipv4_address(tmp_path):
    make_dev(
        tmp_path,
        "rocep1s0f1",
        [
            (LINK_LOCAL, "IB/RoCE v1", "enp1"),
            (LINK_LOCAL, "RoCE v2", "enp1"),
            (v4(10, 0, 0, 1), "IB/RoCE v1", "enp1"),
            (v4(10, 0, 0, 1), "RoCE v2", "enp1"),
        ],
    )
    (dev,) = read_devices(tmp_path)
    port = dev.port(1)
    assert port.active and port.netdevs == ("enp1",) and len(port.gids) == 4  # empty slots skipped
    g = select_gid(port)
    assert (g.index, g.ipv4, g.roce_v2) == (3, "10.0.0.1", True)


def test_prefers_routable_over_loopback_and_honours_an_explicit_index(tmp_path):
    make_dev(
        tmp_path, "rxe0", [(LINK_LOCAL, "RoCE v2", "lo"), (v4(127, 0, 0, 1), "RoCE v2", "lo"), (v4(10, 77, 0, 1), "RoCE v2", "dummy0")]
    )
    port = read_devices(tmp_path)[0].port(1)
    assert select_gid(port).index == 2
    assert select_gid(port, 1).ipv4 == "127.0.0.1"
    with pytest.raises(RdmaUnavailable, match="no GID at index 9"):
        select_gid(port, 9)


def test_no_roce_v2_ipv4_gid_is_a_clear_error(tmp_path):
    make_dev(tmp_path, "mlx5_0", [(LINK_LOCAL, "RoCE v2", "enp1"), (v4(10, 0, 0, 1), "IB/RoCE v1", "enp1")])
    port = read_devices(tmp_path)[0].port(1)
    with pytest.raises(RdmaUnavailable, match=r"no RoCE v2 GID with an IPv4 address on mlx5_0 port 1.*enp1"):
        select_gid(port)
    with pytest.raises(RdmaUnavailable, match="IB/RoCE v1, not RoCE v2"):
        select_gid(port, 1)


def test_endpoints_auto_named_and_missing(tmp_path):
    make_dev(tmp_path, "a_down", [(v4(10, 0, 0, 9), "RoCE v2", "x")], state="1: DOWN")
    make_dev(tmp_path, "b_twin0", [(v4(10, 0, 0, 1), "RoCE v2", "p0")])
    make_dev(tmp_path, "c_twin1", [(v4(10, 0, 1, 1), "RoCE v2", "p1")])
    make_dev(tmp_path, "d_ib", [(LINK_LOCAL, "IB/RoCE v1", "")], link_layer="InfiniBand")
    devs = read_devices(tmp_path)
    auto = select_endpoints(RdmaConfig(), devs)
    assert [e.device for e in auto] == ["b_twin0"]  # first usable; twins must be named
    twins = select_endpoints(RdmaConfig(devices=("c_twin1", "b_twin0")), devs)
    assert [(e.device, e.gid.ipv4) for e in twins] == [("c_twin1", "10.0.1.1"), ("b_twin0", "10.0.0.1")]
    with pytest.raises(RdmaUnavailable, match="nope not found; present: a_down, b_twin0"):
        select_endpoints(RdmaConfig(devices=("nope",)), devs)
    with pytest.raises(RdmaUnavailable, match="DOWN, not ACTIVE"):
        select_endpoints(RdmaConfig(devices=("a_down",)), devs)
    with pytest.raises(RdmaUnavailable, match="InfiniBand, not Ethernet"):
        select_endpoints(RdmaConfig(devices=("d_ib",)), devs)
    with pytest.raises(RdmaUnavailable, match="no port 2"):
        select_endpoints(RdmaConfig(port=2, devices=("b_twin0",)), devs)


def test_no_devices_at_all(tmp_path):
    assert read_devices(tmp_path / "absent") == []
    with pytest.raises(RdmaUnavailable, match="no RDMA devices"):
        select_endpoints(RdmaConfig(), [])
