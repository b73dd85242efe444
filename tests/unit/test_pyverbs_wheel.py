"""The rdma extra's wheel: its name for this Python, and a RECORD pip accepts (the build itself runs in make venv-rdma)."""

from __future__ import annotations

import base64
import hashlib
import sys
import sysconfig
import zipfile

from arxtune.harness import pyverbs_wheel


def test_the_wheel_is_named_for_this_python_and_machine():
    v = sys.version_info
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    assert pyverbs_wheel.wheel_name() == f"pyverbs-59.0+bundled.1-cp{v[0]}{v[1]}-cp{v[0]}{v[1]}{sys.abiflags}-{platform}.whl"
    assert pyverbs_wheel.wheel_name(sys.executable) == pyverbs_wheel.wheel_name()


def test_the_wheel_records_every_file_with_its_hash(tmp_path):
    stage = tmp_path / "stage"
    (stage / "pyverbs").mkdir(parents=True)
    (stage / "pyverbs.libs").mkdir()
    (stage / "pyverbs" / "__init__.py").write_text("")
    (stage / "pyverbs.libs" / "librxe-rdmav59.so").write_bytes(b"\x7fELF...")
    target = pyverbs_wheel._zip(stage, tmp_path / pyverbs_wheel.wheel_name())
    with zipfile.ZipFile(target) as whl:
        info = f"pyverbs-{pyverbs_wheel.full_version()}.dist-info"
        record = whl.read(f"{info}/RECORD").decode().splitlines()
        assert f"Tag: {target.name[len('pyverbs-59.0+bundled.1-') : -4]}" in whl.read(f"{info}/WHEEL").decode()
        assert "Version: 59.0+bundled.1" in whl.read(f"{info}/METADATA").decode()
        for line in record:
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                continue
            data = whl.read(name)
            assert digest == "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert int(size) == len(data)
        assert (whl.getinfo("pyverbs.libs/librxe-rdmav59.so").external_attr >> 16) & 0o777 == 0o755
