"""NCCL's own log read back (what a run records as `nccl_used`), and the pair's NCCL settings.

The logs are NCCL_DEBUG=INFO output in NCCL's formats (src/init.cc, src/transport/net*.cc,
net_ib: "NET/IB : Using [i]dev:port/RoCE ...; OOB if:addr", "Channel cc/i : r[d] -> r[d]
[send] via NET/IB/n", "N coll channels, ..."); the one-GPU lines are copied from the H100
run in results/gpu-h100-20261207, the two-Spark ones follow the public Spark logs' shape.
"""

from __future__ import annotations

from arxtune.harness import nccl_facts
from arxtune.runtime.rdma.device import Endpoint, GidEntry

SPARK_IB = """\
spark-a1:2981:2981 [0] NCCL INFO NCCL version 2.29.3+cuda13.0
spark-a1:2981:2981 [0] NCCL INFO NCCL_IB_GID_INDEX set by environment to 3.
spark-a1:2981:3111 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE [RO]; OOB enp1s0f1np1:10.0.0.1<0>
spark-a1:2981:3111 [0] NCCL INFO Using network IB
spark-a1:2981:3111 [0] NCCL INFO comm 0xaaab1c2d3e40 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
spark-a1:2981:3113 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0
spark-a1:2981:3113 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/1
spark-a1:2981:3113 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0
spark-a1:2981:3113 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1
spark-a1:2981:3113 [0] NCCL INFO NET/IB: ncclIbConnect: NCCL Dev 0 IbDev 0 Port 1 qp_num 331 mtu 5 GID 3 (80FE/A01000A) ctsFifoRkey=0x1f00 ctsFifoLkey=0x1f00
spark-a1:2981:3111 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer
spark-a1:2981:3111 [0] NCCL INFO ncclCommInitRankConfig comm 0xaaab1c2d3e40 rank 0 nranks 2 cudaDev 0 nvmlDev 0 busId 1000 commId 0x5e1 - Init COMPLETE
spark-a1:2981:2981 [0] NCCL INFO AllReduce: 16384 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}
spark-a1:2981:2981 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..1}
"""

ONE_TWIN_SOCKET_DEV = """\
spark-a1:77:77 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
spark-a1:77:90 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE; OOB enp1s0f1np1:10.0.0.1<0>
spark-a1:77:90 [0] NCCL INFO comm 0x55d0 rank 1 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
spark-a1:77:92 [0] NCCL INFO Channel 00/0 : 1[0] -> 0[0] [send] via NET/IB/0
spark-a1:77:92 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [send] via NET/IB/0
spark-a1:77:90 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer
"""

SOCKETS = """\
node-01:1897709:1897709 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
node-01:1897709:1897709 [0] NCCL INFO NET/Socket : Using [0]wlP9s9:192.168.1.20<0>
node-01:1897709:1897709 [0] NCCL INFO Using network Socket
node-01:1897709:1897731 [0] NCCL INFO comm 0x5574 rank 0 nRanks 2 nNodes 2 localRanks 1 localRank 0 MNNVL 0
node-01:1897709:1897731 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] [send] via NET/Socket/0
node-01:1897709:1897731 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[1] [send] via NET/Socket/0
node-01:1897709:1897731 [0] NCCL INFO 2 coll channels, 2 collnet channels, 0 nvls channels, 2 p2p channels, 2 p2p channels per peer
"""

# From results/gpu-h100-20261207 (one H100, world 1): no network in use.
H100_WORLD1 = """\
vm:1909:1909 [0] NCCL INFO ENV/Plugin: Could not find: libnccl-env.so
vm:1909:1909 [0] NCCL INFO NCCL version 2.28.9+cuda13.0
vm:1909:1909 [0] NCCL INFO NCCL_NVLS_ENABLE set by environment to 0.
vm:1909:1920 [0] NCCL INFO Using network Socket
vm:1909:1920 [0] NCCL INFO Successfully loaded external tuner plugin /root/.cache/arxtune/arxtune_tuner-x86_64-10e86774f4ca4e4a.so
vm:1909:1920 [0] NCCL INFO comm 0x1fb47fd0 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0
vm:1909:1920 [0] NCCL INFO Channel 63/64 : 0
vm:1909:1920 [0] NCCL INFO 64 coll channels, 64 collnet channels, 0 nvls channels, 64 p2p channels, 64 p2p channels per peer
vm:1909:1920 [0] NCCL INFO ncclCommInitRankConfig comm 0x1fb47fd0 rank 0 nranks 1 cudaDev 0 nvmlDev 0 busId 60 commId 0x687ea1969346b9ab - Init COMPLETE
"""


def test_two_sparks_over_both_twins():
    used = nccl_facts.parse_log(SPARK_IB).as_dict()
    assert used["version"] == "2.29.3+cuda13.0" and used["network"] == "IB" and used["gid_index"] == 3
    assert used["devices"] == ["rocep1s0f1:1/RoCE", "roceP2p1s0f1:1/RoCE"] and used["oob"] == "enp1s0f1np1:10.0.0.1<0>"
    (comm,) = used["communicators"]
    assert comm == {
        "rank": 0,
        "nranks": 2,
        "nnodes": 2,
        "channels": 2,
        "transports": ["NET/IB"],
        "hcas_used": ["rocep1s0f1:1", "roceP2p1s0f1:1"],
    }
    assert used["choices"] == {"AllReduce": {"16384": "RING/LL", "4194304": "RING/SIMPLE"}}
    assert nccl_facts.problems(used) == []
    assert nccl_facts.summary(used) == (
        "NCCL 2.29.3+cuda13.0, via NET/IB, HCAs roceP2p1s0f1:1,rocep1s0f1:1, GID 3, channels 2, "
        "algo/proto AllReduce 16384:RING/LL,4194304:RING/SIMPLE"
    )


def test_one_twin_is_a_problem():
    used = nccl_facts.parse_log(ONE_TWIN_SOCKET_DEV).as_dict()
    assert used["communicators"][0]["hcas_used"] == ["rocep1s0f1:1"]
    (problem,) = nccl_facts.problems(used)
    assert "one HCA (rocep1s0f1:1) of 2" in problem
    assert nccl_facts.summary(used).endswith("algo/proto not printed")


def test_sockets_are_a_problem():
    used = nccl_facts.parse_log(SOCKETS).as_dict()
    assert used["network"] == "Socket" and used["devices"] == ["wlP9s9"]
    assert used["communicators"][0]["transports"] == ["NET/Socket"]
    assert any("sockets" in p for p in nccl_facts.problems(used))


def test_one_gpu_uses_no_network_and_is_no_problem():
    used = nccl_facts.parse_log(H100_WORLD1).as_dict()
    assert used["communicators"][0]["channels"] == 64 and used["communicators"][0]["transports"] == []
    assert used["tuner"].endswith("arxtune_tuner-x86_64-10e86774f4ca4e4a.so")
    assert nccl_facts.problems(used) == []


def test_an_empty_log_records_nothing():
    used = nccl_facts.parse_log("some other program's output\n").as_dict()
    assert used["version"] is None and used["communicators"] == []
    assert nccl_facts.summary(None) == "not recorded"
    assert nccl_facts.summary({"error": "NCCL_DEBUG=WARN is set"}) == "not recorded (NCCL_DEBUG=WARN is set)"


def test_loaded_library_from_maps():
    maps = (
        "7f00-7f01 r-xp 00000000 08:01 123  /usr/lib/libc.so.6\n"
        "7f10-7f20 r-xp 00000000 08:01 456  /venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2\n"
    )
    assert nccl_facts.loaded_library(maps).endswith("nvidia/nccl/lib/libnccl.so.2")
    assert nccl_facts.loaded_library("7f00-7f01 r-xp 00000000 08:01 123  /usr/lib/libnccl-net.so\n") is None


def test_pair_settings_name_both_twins_and_their_shared_index():
    def ep(dev, index, netdev):
        return Endpoint(dev, 1, GidEntry(index, "0000:0000:0000:0000:0000:ffff:0a00:0001", "RoCE v2", netdev))

    s = nccl_facts.pair_settings([ep("rocep1s0f1", 3, "enp1s0f1np1"), ep("roceP2p1s0f1", 3, "enP2p1s0f1np1")])
    assert s.export_lines() == [
        "export NCCL_IB_HCA==rocep1s0f1:1,roceP2p1s0f1:1",
        "export NCCL_IB_GID_INDEX=3",
        "export NCCL_SOCKET_IFNAME==enp1s0f1np1",
    ]
    assert s.problem is None
    assert nccl_facts.pair_settings([]).values == {}
