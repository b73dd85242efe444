"""arxg's kernels build ahead of time for GB10 (sm_121a), B200 (sm_100a) and H100 (sm_90a) with
Triton's own compile API and the ptxas it bundles, no GPU needed, into images a plain cuLaunchKernel
can launch; and what doctor says when the local Triton cannot build for the local GPU."""

from __future__ import annotations

import pytest

from arxtune.runtime.rdma.graph import aot

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def fresh_triton_cache(tmp_path, monkeypatch):
    """Build for real every time: a cached cubin from an earlier run would prove nothing about this one."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", "1")  # today's default, said out loud (Triton 3.9 warns otherwise)


#: every code path of collective_kernel (each op, integer and float sums, with and without alignment hints)
VARIANTS = [
    aot.Variant("handshake"),
    aot.Variant("collective", "all_reduce", "bfloat16"),
    aot.Variant("collective", "all_reduce", "float32", aligned=False),
    aot.Variant("collective", "all_gather", "float16", ndev=2),
    aot.Variant("collective", "reduce_scatter", "int32"),
]


@pytest.mark.parametrize("arch", list(aot.TARGETS))
def test_every_kernel_builds_for_the_target(arch):
    for v in VARIANTS:
        b = aot.build_variant(v, aot.TARGETS[arch], "s")
        b.check()  # launchable with NULL scratch pointers
        assert b.arch == arch and b.variant == v.name
        assert b.cubin[:4] == b"\x7fELF" and arch[:-1].encode() in b.cubin, v.name


def test_doctor_says_when_the_local_triton_cannot_build_and_names_triton_ptxas_path(monkeypatch):
    def too_old(capability):
        raise RuntimeError(
            "PTXAS error: Internal Triton PTX codegen error\nptxas fatal : Value 'sm_121a' is not defined for option 'gpu-name'"
        )

    line = aot.local_build_line(121, too_old)
    assert "cannot build for sm_121a: PTXAS error" in line and "set TRITON_PTXAS_PATH" in line
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/usr/local/cuda-12.8/bin/ptxas")
    assert "TRITON_PTXAS_PATH=/usr/local/cuda-12.8/bin/ptxas is set: that ptxas must know sm_121a" in aot.local_build_line(121, too_old)
    assert aot.local_build_line(90, lambda cap: None).endswith(
        "builds arxg's handshake kernel for sm_90a here (ptxas from TRITON_PTXAS_PATH=/usr/local/cuda-12.8/bin/ptxas)"
    )


def test_doctor_build_check_really_builds_for_a_target(monkeypatch):
    """The default compile_one is a real build: here, for sm_90a."""
    assert aot.local_build_line(90).endswith("builds arxg's handshake kernel for sm_90a here")
