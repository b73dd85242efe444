"""`arxtune doctor` on a fake machine (on the lab's device: tests/rdma/device/test_doctor_device.py)."""

from __future__ import annotations


from arxtune.harness.doctor import Host, doctor, format_rows
from arxtune.harness.doctor.rows import FAIL, OK
from test_device import make_dev, v4


class _Verbs:
    def status(self):
        return None, {"version": "59.0+bundled.1", "file": "pyverbs", "bundled": True}

    def device_names(self):
        return ["rxe0"]

    def active_mtu(self, device, port):
        return 1024

    def register(self, device, nbytes):
        return None


def test_report_on_a_fake_machine(tmp_path):
    make_dev(tmp_path / "sys/class/infiniband", "rxe0", [(v4(127, 0, 0, 1), "RoCE v2", "lo"), (v4(10, 77, 0, 1), "RoCE v2", "dummy0")])
    rows = {r.item: r for r in doctor(Host(root=tmp_path, verbs=_Verbs(), memlock=None, torch_nccl=None, addresses={}))}  # type: ignore[arg-type]
    assert rows["rxe0 port 1"].finding.startswith("ACTIVE, Ethernet, active MTU 1024")
    assert rows["rxe0 port 1"].data["gid_index"] == 1 and "GID 1 (10.77.0.1 on dummy0)" in rows["rxe0 port 1"].finding
    assert rows["memory registration"].status == OK
    assert "backend gloo" in rows and "backend arx" in rows
    assert "backend arx2" in format_rows(list(rows.values()))


def test_bad_environment_setting_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv("ARXTUNE_RDMA_MAX_BYTES", "huge")
    rows = {r.item: r for r in doctor()}
    assert rows["arx settings"].status == FAIL and "not a byte size" in rows["arx settings"].finding
