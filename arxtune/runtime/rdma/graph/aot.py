"""Ahead-of-time builds of every arxg kernel for a named GPU, with no GPU present.

Triton's own compile API (triton.compile on an ASTSource, for a GPUTarget) runs
the whole pipeline down to the cubin with the ptxas Triton bundles (or the one
TRITON_PTXAS_PATH names). The CI test builds for GB10 (sm_121a), B200
(sm_100a) and H100 (sm_90a); `arxtune doctor` builds for the local GPU, which
is how it learns whether this Triton's ptxas knows it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: (name, OP, element type, integer accumulation): every code path of collective_kernel
VARIANTS = (
    ("all_reduce bf16", 0, "bf16", False),
    ("all_reduce fp32", 0, "fp32", False),
    ("all_gather fp16", 1, "fp16", False),
    ("reduce_scatter i32", 2, "i32", True),
)
#: archs whose name takes the "a" suffix (arch-specific features): what Triton targets from sm_90 on
TARGETS = {"sm_121a": 121, "sm_100a": 100, "sm_90a": 90}


@dataclass(frozen=True)
class Built:
    name: str
    arch: str  # what the cubin/ptx is for, e.g. "sm_121a"
    ptx: str
    cubin: bytes


def _collective_source(op: int, elem: str, int_acc: bool, world: int = 2, ndev: int = 2):
    from triton.compiler import ASTSource

    from arxtune.runtime.rdma.graph import kernels

    pointers = {"inp": f"*{elem}", "out": f"*{elem}", "staging": f"*{elem}", "sources": "*i64", "flags": "*i64",
                "ctrl": "*i64", "counter": "*i64"}
    scalars = {"rank": "i32", "n_stage": "i32", "n_part": "i32", "slot_elems": "i32", "nbytes": "i32",
               "ndev_used": "i32", "op_code": "i32", "timeout_ns": "i64"}
    constexprs = {"OP": op, "WORLD": world, "NDEV": ndev, "INT_ACC": int_acc, "BLOCK": kernels.BLOCK}
    fn = kernels.collective_kernel
    signature = {name: pointers.get(name) or scalars.get(name) or "constexpr" for name in fn.arg_names}
    return ASTSource(fn, signature, constexprs=constexprs)


def _handshake_source():
    from triton.compiler import ASTSource

    from arxtune.runtime.rdma.graph import kernels

    return ASTSource(kernels.handshake_kernel, {"ctrl": "*i64", "counter": "*i64", "op_code": "i32", "timeout_ns": "i64"})


def sources() -> list[tuple[str, object]]:
    """(name, ASTSource) of every kernel arxg launches, one per code path."""
    found = [(f"collective_kernel {name}", _collective_source(op, elem, acc)) for name, op, elem, acc in VARIANTS]
    return found + [("handshake_kernel", _handshake_source())]


def build(capability: int, only: tuple[str, ...] | None = None) -> list[Built]:
    """Compile every kernel (or the names in `only`) for compute capability `capability` (121 = sm_121a).

    Raises what Triton raises (a PTXASError names ptxas's complaint)."""
    import triton
    from triton.backends.compiler import GPUTarget

    from arxtune.runtime.rdma.graph import kernels

    target = GPUTarget("cuda", capability, 32)
    out = []
    for name, src in sources():
        if only is not None and name not in only:
            continue
        warps = kernels.NUM_WARPS if name.startswith("collective") else 1
        compiled = triton.compile(src, target=target, options={"num_warps": warps})
        arch = f"sm_{capability}{'a' if capability >= 90 else ''}"
        out.append(Built(name, arch, compiled.asm.get("ptx", ""), compiled.asm.get("cubin", b"")))
    return out


def local_build_line(capability: int, compile_one=None) -> str:
    """What doctor says about building arxg's kernels for the local GPU (`compile_one(capability)` builds one
    kernel; tests pass a fake): whether it built, and what to set when Triton's ptxas is too old."""
    import os

    arch = f"sm_{capability}{'a' if capability >= 90 else ''}"
    compile_one = compile_one or (lambda cap: build(cap, only=("handshake_kernel",)))
    try:
        import triton

        version = triton.__version__
    except ImportError as exc:
        return f"cannot build: Triton is not importable ({exc})"
    try:
        compile_one(capability)
    except Exception as exc:  # doctor reports, it never fails
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        ptxas = os.environ.get("TRITON_PTXAS_PATH")
        hint = (f"TRITON_PTXAS_PATH={ptxas} is set: that ptxas must know {arch}" if ptxas else
                f"if its ptxas is too old for {arch}, set TRITON_PTXAS_PATH to a newer ptxas (CUDA 13's knows sm_121a)")
        return f"Triton {version} cannot build for {arch}: {first[:200]}; {hint}"
    via = f" (ptxas from TRITON_PTXAS_PATH={os.environ['TRITON_PTXAS_PATH']})" if os.environ.get("TRITON_PTXAS_PATH") else ""
    return f"Triton {version} builds arxg's handshake kernel for {arch} here{via}"
