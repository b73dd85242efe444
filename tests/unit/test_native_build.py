"""The proxy's C loops build for aarch64 (GB10's host CPU), with the barriers its weaker memory order needs.

A cross-compile (-c, nothing runs): the object must contain acquire loads (ldar)
for the doorbell and bells, release stores (stlr) for SENT and the flags, and, in
the verbs loop, the full fence (dmb ish) before ibv_post_send
(docs/arxg-ordering.md). scripts/install-build-deps.sh installs the cross
compiler and the verbs headers; without them this test skips on a developer
machine and fails in CI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

GRAPH = Path(__file__).resolve().parents[2] / "arxtune" / "runtime" / "rdma" / "graph"
CROSS = "aarch64-linux-gnu-gcc"
OBJDUMP = "aarch64-linux-gnu-objdump"
VERBS_H = Path("/usr/include/infiniband/verbs.h")


def _missing(what: str):
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{what} is missing: run scripts/install-build-deps.sh")
    pytest.skip(f"{what} is missing (scripts/install-build-deps.sh installs it)")


@pytest.fixture(scope="module")
def include_dir(tmp_path_factory) -> Path:
    """Only the verbs headers of the host's libibverbs-dev (architecture-independent), next to the cross sysroot."""
    if not shutil.which(CROSS) or not shutil.which(OBJDUMP):
        _missing(f"the aarch64 cross compiler ({CROSS}, {OBJDUMP})")
    if not VERBS_H.exists():
        _missing(f"{VERBS_H} (libibverbs-dev)")
    d = tmp_path_factory.mktemp("inc")
    (d / "infiniband").symlink_to(VERBS_H.parent)
    return d


def _disassemble(source: Path, include: Path, out: Path) -> str:
    obj = out / f"{source.stem}.o"
    cc = subprocess.run(
        [CROSS, "-O2", "-fPIC", "-Wall", "-Werror", "-I", str(include), "-c", str(source), "-o", str(obj)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert cc.returncode == 0, cc.stderr
    return subprocess.run([OBJDUMP, "-d", str(obj)], capture_output=True, text=True, timeout=60, check=True).stdout


@pytest.mark.parametrize("source, fence", [("serve_shm.c", False), ("serve_verbs.c", True)])
def test_the_proxy_loop_builds_for_aarch64_with_its_barriers(include_dir, tmp_path, source, fence):
    asm = _disassemble(GRAPH / source, include_dir, tmp_path)
    ops = {line.split("\t")[2].split()[0] for line in asm.splitlines() if line.count("\t") >= 2}
    assert "ldar" in ops, "no acquire load of the bells"
    assert "stlr" in ops, "no release store"
    if fence:
        assert any("dmb\tish" in line or "dmb ish" in line for line in asm.splitlines()), "no full fence before the post"


def test_the_kernel_launcher_and_nccls_loop_build_for_aarch64(include_dir, tmp_path):
    """cuda_launch.c (arxg's launches, the decode view's busy kernel) reads a blocked proxy's ASLEEP word with
    an ordered load (ldar) before it bumps WAKE; nccl's loop builds too."""
    runtime = GRAPH.parents[1]
    asm = _disassemble(runtime / "cuda_launch.c", include_dir, tmp_path)
    ops = {line.split("\t")[2].split()[0] for line in asm.splitlines() if line.count("\t") >= 2}
    assert "ldar" in ops, "no ordered load of the proxy's ASLEEP word"
    _disassemble(runtime / "backends" / "nccl_burst.c", include_dir, tmp_path)
