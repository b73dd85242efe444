"""Every row of `arxtune doctor` on a fake machine: healthy, and each failure the field has met, with its fix named.

The machine is a fake tree (sysfs, /proc, /etc, library directories) with fake pyverbs and GPU
probes (tests/helpers/fake_host.py); the failures are FIELD-NOTES section 11's.
"""

from __future__ import annotations

import json
import tarfile

import pytest

from arxtune.harness.doctor import checks, report
from arxtune.harness.doctor.rows import FAIL, INFO, OK, WARN, format_rows
from helpers.fake_host import FakeGpus, FakeVerbs, LINK_LOCAL, elf_with, rdma_device, spark, v4, write


def by_item(rows):
    return {r.item: r for r in rows}


def test_a_healthy_spark_passes_every_row(tmp_path):
    host = spark(tmp_path)
    rows = checks.run(host, [c for c in checks.CHECKS if c.name not in ("arxg", "backends")])
    got = by_item(rows)
    assert not [r for r in rows if r.status in (FAIL, WARN)], format_rows(rows)
    assert got["pyverbs"].finding.startswith("59.0+bundled.1") and "sees roceP2p1s0f0, roceP2p1s0f1" in got["pyverbs"].finding
    assert got["rocep1s0f1 port 1"].finding == (
        "ACTIVE, Ethernet, active MTU 4096 (enp1s0f1np1 MTU 9000), RoCE v2 IPv4 GID 3 (10.0.0.1 on enp1s0f1np1)"
    )
    assert got["rocep1s0f0 port 1"].status == INFO and "not cabled" in got["rocep1s0f0 port 1"].finding
    assert got["twins roceP2p1s0f1+rocep1s0f1"].status == OK
    assert got["twins roceP2p1s0f0+rocep1s0f0"].status == INFO
    assert got["memory registration"].status == OK and "CmaTotal 524288 kB" in got["memory registration"].finding
    assert got["nccl library"].status == OK and "version 2.29.3+cuda13.0, build 1234567812345678" in got["nccl library"].finding
    assert got["nccl for the pair"].finding == (
        "export NCCL_IB_HCA==roceP2p1s0f1:1,rocep1s0f1:1; export NCCL_IB_GID_INDEX=3; export NCCL_SOCKET_IFNAME==enP2p1s0f1np1"
    )
    assert "GPUDirect RDMA no, dma-buf no: on an integrated GPU (GB10)" in got["gpu 0"].finding


# ---- pyverbs --------------------------------------------------------------------------------------------


def test_pyverbs_missing_names_the_extra(tmp_path):
    host = spark(tmp_path, verbs=FakeVerbs(error="ModuleNotFoundError: No module named 'pyverbs'", root=tmp_path))
    row = by_item(checks.check_pyverbs(host))["pyverbs"]
    assert row.status == FAIL and "arxtune pyverbs install" in row.fix and "python3-dev" in row.fix


def test_the_registrys_plain_pyverbs_is_recognised(tmp_path):
    error = (
        "ImportError: /lib/x86_64-linux-gnu/libibverbs.so.1: version `IBVERBS_PRIVATE_59' not found "
        "(required by .../pyverbs/device.cpython-311-x86_64-linux-gnu.so)"
    )
    row = checks.check_pyverbs(spark(tmp_path, verbs=FakeVerbs(error=error, root=tmp_path)))[0]
    assert row.status == FAIL and "registry's plain pyverbs" in row.fix and "arxtune pyverbs install" in row.fix


def test_pyverbs_without_a_provider_for_a_device(tmp_path):
    host = spark(tmp_path, verbs=FakeVerbs(seen=["rocep1s0f1"], root=tmp_path))
    (tmp_path / "etc/libibverbs.d").rmdir()
    row = checks.check_pyverbs(host)[0]
    assert row.status == FAIL and "roceP2p1s0f1" in row.finding
    assert "ibverbs-providers" in row.fix and "libibverbs.d is missing" in row.fix


def test_no_rdma_at_all_is_not_a_failure(tmp_path):
    host = spark(tmp_path / "empty", verbs=FakeVerbs(error="ModuleNotFoundError: No module named 'pyverbs'"))
    import shutil

    shutil.rmtree(tmp_path / "empty" / "sys")
    rows = checks.run(host, [c for c in checks.CHECKS if c.name in ("pyverbs", "ports", "twins", "registration", "nccl for the pair")])
    assert not [r for r in rows if r.status == FAIL], format_rows(rows)
    assert by_item(rows)["pyverbs"].status == WARN


# ---- ports, GIDs, MTU, twins ----------------------------------------------------------------------------


def test_mtu_1500_is_named_with_the_command(tmp_path):
    host = spark(tmp_path, verbs=FakeVerbs(mtus={"rocep1s0f1": 1024}, root=tmp_path))
    write(tmp_path / "sys/class/net/enp1s0f1np1/mtu", "1500\n")
    row = by_item(checks.check_ports(host))["rocep1s0f1 port 1"]
    assert row.status == WARN and "active MTU 1024 (enp1s0f1np1 MTU 1500)" in row.finding
    assert "ip link set dev enp1s0f1np1 mtu 9000" in row.fix


def test_a_port_without_an_ipv4_gid_fails(tmp_path):
    host = spark(tmp_path)
    rdma_device(tmp_path, "rocep9s0f0", [(LINK_LOCAL, "RoCE v2", "enp9s0f0")])
    row = by_item(checks.check_ports(host))["rocep9s0f0 port 1"]
    assert row.status == FAIL and "ip addr add" in row.fix and "enp9s0f0" in row.fix


def test_one_twin_down_fails_the_pair(tmp_path):
    host = spark(tmp_path)
    write(tmp_path / "sys/class/infiniband/roceP2p1s0f1/ports/1/state", "1: DOWN\n")
    row = by_item(checks.check_twins(host))["twins roceP2p1s0f1+rocep1s0f1"]
    assert row.status == FAIL and "only rocep1s0f1" in row.finding and "roceP2p1s0f1" in row.fix


def test_gid_index_is_read_where_it_is(tmp_path):
    """The GID index moves between boxes and reboots: the row says where the IPv4 RoCE v2 GID is now."""
    host = spark(tmp_path)
    rdma_device(
        tmp_path,
        "rocep1s0f1",
        [
            (LINK_LOCAL, "RoCE v2", "enp1s0f1np1"),
            ("fd00:0000:0000:0000:0000:0000:0000:0001", "RoCE v2", "enp1s0f1np1"),
            (v4(10, 0, 0, 1), "IB/RoCE v1", "enp1s0f1np1"),
            (LINK_LOCAL, "IB/RoCE v1", "enp1s0f1np1"),
            (v4(10, 0, 0, 1), "RoCE v2", "enp1s0f1np1"),
        ],
    )
    row = by_item(checks.check_ports(host))["rocep1s0f1 port 1"]
    assert row.data["gid_index"] == 4 and "GID 4 (10.0.0.1" in row.finding
    pair = checks.check_pair_settings(host)[0]
    assert pair.status == WARN and "different indexes" in pair.fix and "NCCL_IB_GID_INDEX" not in pair.data["values"]


# ---- memory ---------------------------------------------------------------------------------------------


def test_registration_failing_with_no_cma_names_the_kernel(tmp_path):
    host = spark(
        tmp_path,
        verbs=FakeVerbs(
            register_errors={"rocep1s0f1": "PyverbsRDMAError: Failed to register a MR. Errno: 12, Cannot allocate memory"}, root=tmp_path
        ),
    )
    write(tmp_path / "proc/meminfo", "MemTotal: 128000000 kB\nCmaTotal:              0 kB\nCmaFree:               0 kB\n")
    row = checks.check_registration(host)[0]
    assert row.status == FAIL and "Cannot allocate memory" in row.finding and "CmaTotal 0 kB" in row.finding
    assert "no CMA memory" in row.fix and "another kernel" in row.fix


def test_registration_failing_with_cma_says_memlock(tmp_path):
    host = spark(tmp_path, verbs=FakeVerbs(register_errors={"roceP2p1s0f1": "Errno: 12"}, root=tmp_path))
    row = checks.check_registration(host)[0]
    assert row.status == FAIL and "ulimit -l" in row.fix


def test_locked_memory_below_what_arx_needs(tmp_path):
    row = checks.check_memlock(spark(tmp_path, memlock=64 << 10))[0]
    assert row.status == FAIL and "memlock" in row.fix
    assert checks.check_memlock(spark(tmp_path / "root", memlock=64 << 10, euid=0))[0].status == OK


# ---- NCCL -----------------------------------------------------------------------------------------------


def test_nccl_before_2_29_3_on_arm_fails_and_an_old_copy_on_the_path_warns(tmp_path):
    host = spark(tmp_path)
    old = write(tmp_path / "opt/nccl/libnccl.so.2", elf_with("2.28.9+cuda13.0", b"\xab" * 20))
    host.torch_nccl = str(old)
    host.env = {"LD_LIBRARY_PATH": str(tmp_path / "opt/nccl")}
    rows = checks.check_nccl_library(host)
    assert rows[0].status == FAIL and "2.28.9+cuda13.0" in rows[0].finding and "hang on ARM" in rows[0].finding
    assert "2.29.3" in rows[0].fix
    assert rows[1].item.strip() == "other libnccl" and "2.29.3+cuda13.0" in rows[1].finding
    host.env["ARXTUNE_NCCL_LIBRARY"] = str(old)  # what the nccl backend binds: the same warning
    bound = by_item(checks.check_nccl_library(host))["  ARXTUNE_NCCL_LIBRARY"]
    assert bound.status == FAIL and "2.28.9" in bound.finding
    host.machine = "x86_64"
    assert checks.check_nccl_library(host)[0].status == OK


def test_two_builds_of_one_version_are_told_apart(tmp_path):
    from arxtune.harness.nccl_facts import library_info

    a = library_info(write(tmp_path / "a/libnccl.so.2", elf_with("2.28.9+cuda13.0", b"\x01" * 20)))
    b = library_info(write(tmp_path / "b/libnccl.so.2", elf_with("2.28.9+cuda13.0", b"\x02" * 20)))
    assert a.version == b.version == "2.28.9+cuda13.0" and a.build_id == "01" * 20 != b.build_id


def test_no_nccl_is_information(tmp_path):
    assert checks.check_nccl_library(spark(tmp_path, torch_nccl=None))[0].status == INFO


@pytest.mark.parametrize(
    "setting, hurts",
    [
        ("NCCL_IB_USE_INLINE=1", FAIL),
        ("NCCL_IB_PREPOST_RECEIVE_WORK_REQUESTS=1", FAIL),
        ("NCCL_IB_DISABLE=1", FAIL),
        ("NCCL_NET=Socket", FAIL),
        ("NCCL_PROTO=LL", WARN),
        ("NCCL_IB_GID_INDEX=0", FAIL),
        ("NCCL_IB_HCA==rocep1s0f1:1", WARN),
        ("NCCL_IB_GID_INDEX=3", None),
        ("NCCL_DEBUG=WARN", None),
    ],
)
def test_a_stale_nccl_conf_is_named(tmp_path, setting, hurts):
    host = spark(tmp_path)
    write(tmp_path / "etc/nccl.conf", f"# left by an image\n{setting}\n")
    rows = checks.check_nccl_env(host)
    assert rows[0].status == INFO and setting.replace("==", "=", 0) in rows[0].finding and "/etc/nccl.conf" in rows[0].finding
    named = [r for r in rows[1:] if r.item.strip() == setting.split("=")[0]]
    if hurts is None:
        assert not named, format_rows(rows)
    else:
        assert named and named[0].status == hurts and named[0].fix, format_rows(rows)


def test_environment_and_home_conf_are_read_too(tmp_path):
    host = spark(tmp_path, env={"NCCL_IB_DISABLE": "1"})
    write(tmp_path / "home/.nccl.conf", "NCCL_IB_USE_INLINE=1\n")
    rows = by_item(checks.check_nccl_env(host))
    assert rows["  NCCL_IB_DISABLE"].status == FAIL and "environment" in rows["  NCCL_IB_DISABLE"].finding
    assert ".nccl.conf" in rows["  NCCL_IB_USE_INLINE"].fix


def test_a_net_plugin_with_tuner_symbols_while_the_tuner_is_unset(tmp_path):
    host = spark(tmp_path)
    write(tmp_path / "usr/lib/aarch64-linux-gnu/libnccl-net.so", elf_with(None, extra=b"\x00ncclNetPlugin_v10\x00ncclTunerPlugin_v5\x00"))
    row = checks.check_tuner_plugin(host)[0]
    assert row.status == FAIL and "NCCL_TUNER_PLUGIN=none" in row.fix
    host.env = {"NCCL_TUNER_PLUGIN": "none"}
    assert checks.check_tuner_plugin(host)[0].status == OK
    write(tmp_path / "usr/lib/aarch64-linux-gnu/libnccl-net.so", elf_with(None, extra=b"\x00ncclNetPlugin_v10\x00"))
    host.env = {}
    assert checks.check_tuner_plugin(host)[0].status == OK


# ---- the GPU ----------------------------------------------------------------------------------------------


def test_a_discrete_gpu_says_what_it_supports(tmp_path):
    h100 = {
        "index": 0,
        "name": "NVIDIA H100",
        "capability": "9.0",
        "integrated": 0,
        "pageable_memory_access": 0,
        "host_page_tables": 0,
        "gpu_direct_rdma": 1,
        "dma_buf": 1,
    }
    row = checks.check_gpus(spark(tmp_path, gpus=FakeGpus([h100])))[0]
    assert "integrated no" in row.finding and "GPUDirect RDMA yes, dma-buf yes" in row.finding and "GB10" not in row.finding


# ---- the whole and its report -------------------------------------------------------------------------------


def test_a_check_that_raises_is_its_own_row(tmp_path):
    def broken(host):
        raise ValueError("boom")

    rows = checks.run(spark(tmp_path), [checks.Check("broken", broken)])
    assert rows[0].status == FAIL and "ValueError: boom" in rows[0].finding


def test_report_carries_the_rows_and_nothing_secret(tmp_path):
    host = spark(
        tmp_path,
        env={
            "NCCL_IB_HCA": "=rocep1s0f1:1",
            "ARXTUNE_RDMA_PORT": "1",
            "HF_TOKEN": "hf_secret",
            "AWS_SECRET_ACCESS_KEY": "aws_secret",
            "CUDA_VISIBLE_DEVICES": "0",
        },
    )
    write(tmp_path / "etc/nccl.conf", "NCCL_IB_USE_INLINE=1\n")
    rows = checks.run(host, [c for c in checks.CHECKS if c.name not in ("arxg", "backends")])
    target = report.write(tmp_path / "out" / "doctor.tgz", rows, host)
    with tarfile.open(target) as tar:
        names = tar.getnames()
        text = {n: tar.extractfile(n).read().decode() for n in names}
    everything = "".join(text.values())
    assert "hf_secret" not in everything and "aws_secret" not in everything
    assert text["arxtune-doctor/environment.txt"] == "ARXTUNE_RDMA_PORT=1\nCUDA_VISIBLE_DEVICES=0\nNCCL_IB_HCA==rocep1s0f1:1\n"
    doc = json.loads(text["arxtune-doctor/doctor.json"])
    assert [r["item"] for r in doc["rows"]] == [r.item for r in rows]
    assert "arxtune-doctor/sys/class/infiniband/rocep1s0f1/ports/1/gids/3" in names
    assert text["arxtune-doctor/sys/class/net/enp1s0f1np1/mtu"] == "9000\n"
    assert text["arxtune-doctor/etc/nccl.conf"] == "NCCL_IB_USE_INLINE=1\n" and "CmaTotal" in text["arxtune-doctor/proc/meminfo"]
    report.write(target, rows, host)  # an older report is replaced
    write(tmp_path / "notes.txt", "mine")
    with pytest.raises(Exception, match="--report"):
        report.write(tmp_path / "notes.txt", rows, host)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_gb10_sweep_config_sets_the_same_nccl_lines_where_unset(tmp_path, monkeypatch):
    from arxtune.harness.config import load_config
    from arxtune.harness.sweep import pair_settings_for

    for name in ("NCCL_IB_HCA", "NCCL_IB_GID_INDEX", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "=eth9")  # the user's own stands
    config = load_config("configs/sweep/gb10-2node.toml")
    applied = pair_settings_for(config, spark(tmp_path))
    assert applied == {"NCCL_IB_HCA": "=rocep1s0f1:1,roceP2p1s0f1:1", "NCCL_IB_GID_INDEX": "3"}
    import os

    assert os.environ["NCCL_IB_HCA"] == "=rocep1s0f1:1,roceP2p1s0f1:1" and os.environ["NCCL_SOCKET_IFNAME"] == "=eth9"
    assert pair_settings_for(config.with_overrides(), spark(tmp_path / "b")) == {}  # already set now
    from dataclasses import replace

    assert pair_settings_for(replace(config, nccl_pair_settings=False), spark(tmp_path / "c")) == {}


def test_the_command_prints_the_export_lines_and_exits_1_on_a_failing_row(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import arxtune.harness.doctor as doc
    from arxtune.cli import app

    host = spark(tmp_path)
    rows = checks.run(host, [c for c in checks.CHECKS if c.name not in ("arxg", "backends")])
    monkeypatch.setattr(doc, "doctor", lambda: rows)
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-3:] == [
        "export NCCL_IB_HCA==roceP2p1s0f1:1,rocep1s0f1:1",
        "export NCCL_IB_GID_INDEX=3",
        "export NCCL_SOCKET_IFNAME==enP2p1s0f1np1",
    ]
    data = json.loads(CliRunner().invoke(app, ["doctor", "--json"]).output)
    assert [r["item"] for r in data] == [r.item for r in rows]
    host.memlock = 1024
    monkeypatch.setattr(doc, "doctor", lambda: checks.run(host, [checks.Check("memlock", checks.check_memlock)]))
    result = CliRunner().invoke(app, ["doctor"])
    assert result.exit_code == 1 and "FAIL" in result.output and "fix: ulimit -l unlimited" in result.output
