"""`arxtune doctor` report (pure: fake sysfs; and on the device when there is one)."""

from __future__ import annotations

import pytest

import arxtune.harness.doctor as doctor_mod
from arxtune.harness.doctor import doctor, format_report
from test_device import make_dev, v4


def test_report_on_a_fake_machine(tmp_path, monkeypatch):
    make_dev(tmp_path, "rxe0", [(v4(127, 0, 0, 1), "RoCE v2", "lo"), (v4(10, 77, 0, 1), "RoCE v2", "dummy0")])
    from arxtune.runtime.rdma import device

    monkeypatch.setattr(doctor_mod, "read_devices", lambda: device.read_devices(tmp_path))
    rows = dict(doctor())
    assert rows["rxe0 port 1"].startswith("ACTIVE, Ethernet, active MTU")
    assert rows["  GID 1"] == "RoCE v2 10.77.0.1 on dummy0  <- arx uses this"
    assert rows["  GID 0"] == "RoCE v2 127.0.0.1 on lo"
    assert "ulimit -l" in " ".join(rows) and "backend gloo" in rows and "backend arx" in rows
    text = format_report(doctor())
    assert "backend arx2" in text and "gpus" in text


def test_bad_environment_setting_is_reported_not_raised(monkeypatch):
    monkeypatch.setenv("ARXTUNE_RDMA_MAX_BYTES", "huge")
    rows = dict(doctor())
    assert "not a byte size" in rows["arx settings"]


@pytest.mark.rdma
def test_doctor_on_the_device_says_arx_can_run():
    rows = dict(doctor())
    print(format_report(list(rows.items())))
    assert rows["backend arx"] == "can run (under torchrun)"
    assert any("<- arx uses this" in v for v in rows.values())
