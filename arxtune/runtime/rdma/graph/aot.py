"""Builds of arxg's kernels for a named GPU with Triton's own compile API, no GPU needed.

triton.compile on an ASTSource, for a GPUTarget, runs the whole pipeline down to
the cubin with the ptxas Triton bundles (or the one TRITON_PTXAS_PATH names).
Each `Variant` is one specialisation (op, element type, world, devices, and
whether the pointers and counts are 16-aligned, the hint Triton's own launcher
would have derived), built into an abi.KernelImage: cubin plus what launching it
takes, read from the compiled kernel. Only this module needs Triton; images.py
caches what it builds, and GPU ranks load and launch images without Triton.

A build for another machine (a Spark whose Triton is too old for sm_121a):

    python -m arxtune.runtime.rdma.graph.aot --arch sm_121a --world 2 --ndev 1 2 --out DIR

then copy DIR there and point ARXTUNE_ARXG_KERNELS at it. CI builds for GB10
(sm_121a), B200 (sm_100a) and H100 (sm_90a); `arxtune doctor` says which build
a GPU here would load.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from arxtune.runtime.rdma.graph import abi

#: archs whose name takes the "a" suffix (arch-specific features): what Triton targets from sm_90 on
TARGETS = {"sm_121a": 121, "sm_100a": 100, "sm_90a": 90}
#: element types the kernels take, by torch dtype name
ELEMENTS = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "int32": "i32"}
OPS = {"all_reduce": 0, "all_gather": 1, "reduce_scatter": 2}
#: the oldest Triton whose compile API (ASTSource attrs as a dict) this module speaks
MIN_TRITON = (3, 3)

_POINTERS = ("inp", "out", "staging", "sources", "flags", "ctrl", "counter")
_SCALARS = {
    "rank": "i32",
    "n_stage": "i32",
    "n_part": "i32",
    "slot_elems": "i32",
    "nbytes": "i32",
    "ndev_used": "i32",
    "op_code": "i32",
    "timeout_ns": "i64",
}
#: counts a 16-aligned build may assume divisible by 16 (as Triton's launcher marks such integers)
_ALIGNED_COUNTS = ("n_stage", "n_part", "slot_elems")


@dataclass(frozen=True)
class Variant:
    """One specialisation of a kernel: `kernel` "collective" (with op, dtype, world, ndev, aligned) or "handshake"."""

    kernel: str = "collective"
    op: str = "all_reduce"
    dtype: str = "bfloat16"
    world: int = 2
    ndev: int = 1
    aligned: bool = True

    @property
    def name(self) -> str:
        if self.kernel == "handshake":
            return "handshake"
        return f"{self.op}-{ELEMENTS[self.dtype]}-w{self.world}-d{self.ndev}-{'a16' if self.aligned else 'any'}"


def arch_name(capability: int) -> str:
    return f"sm_{capability}{'a' if capability >= 90 else ''}"


def aligned(named: dict) -> bool:
    """Whether a call's arguments let it use the 16-aligned build: every pointer and count divisible by 16."""
    return all(int(named[k]) % 16 == 0 for k in (*_POINTERS, *_ALIGNED_COUNTS))


def _source(v: Variant):
    from triton.compiler import ASTSource

    from arxtune.runtime.rdma.graph import kernels

    if v.kernel == "handshake":
        sig = {"ctrl": "*i64", "counter": "*i64", "op_code": "i32", "timeout_ns": "i64"}
        return kernels.handshake_kernel, ASTSource(kernels.handshake_kernel, sig, attrs={}), 1
    fn, elem = kernels.collective_kernel, ELEMENTS[v.dtype]
    types = {
        "inp": f"*{elem}",
        "out": f"*{elem}",
        "staging": f"*{elem}",
        "sources": "*i64",
        "flags": "*i64",
        "ctrl": "*i64",
        "counter": "*i64",
        **_SCALARS,
    }
    constexprs = {"OP": OPS[v.op], "WORLD": v.world, "NDEV": v.ndev, "INT_ACC": v.dtype == "int32", "BLOCK": abi.BLOCK}
    signature = {name: types.get(name, "constexpr") for name in fn.arg_names}
    hinted = (*_POINTERS, *_ALIGNED_COUNTS) if v.aligned else ()
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in hinted}
    return fn, ASTSource(fn, signature, constexprs=constexprs, attrs=attrs), abi.NUM_WARPS


def triton_version() -> str:
    """The installed Triton's version; ImportError where there is none."""
    import triton

    return triton.__version__


def triton_too_old(version: str) -> bool:
    try:
        return tuple(int(x) for x in version.split(".")[:2]) < MIN_TRITON
    except ValueError:
        return False


def build_variant(v: Variant, capability: int, source_hash: str = "") -> abi.KernelImage:
    """Compile one variant for compute capability `capability` (121 = sm_121a) into a checked KernelImage.

    Raises what Triton raises (a PTXASError names ptxas's complaint), or abi.AbiError."""
    import triton
    from triton.backends.compiler import GPUTarget

    if triton_too_old(triton.__version__):
        raise RuntimeError(f"Triton {triton.__version__} is older than {'.'.join(map(str, MIN_TRITON))}, whose compile API this build uses")
    fn, src, warps = _source(v)
    compiled = triton.compile(src, target=GPUTarget("cuda", capability, 32), options={"num_warps": warps})
    md = compiled.metadata
    meta = md._asdict() if hasattr(md, "_asdict") else dict(vars(md))
    name = meta.get("name", fn.__name__)
    image = abi.KernelImage(
        name=name,
        variant=v.name,
        arch=arch_name(capability),
        source=source_hash,
        triton=triton.__version__,
        num_warps=int(meta.get("num_warps", warps)),
        shared=int(meta.get("shared", 0) or 0),
        args=tuple((k, t) for k, t in src.signature.items() if t != "constexpr"),
        params=tuple(abi.entry_params(compiled.asm["ptx"], name)),
        scratch={k: int(val or 0) for k, val in meta.items() if k.endswith("_scratch_size")},
        launch={
            "num_ctas": int(meta.get("num_ctas", 1) or 1),
            "cooperative": bool(meta.get("launch_cooperative_grid")),
            "pdl": bool(meta.get("launch_pdl")),
        },
        cubin=compiled.asm["cubin"],
    )
    image.check()
    return image


def bundle_variants(worlds=(2,), ndevs=(1, 2)) -> list[Variant]:
    """Every variant a deployment of these world sizes and device counts may call: each op and element type,
    aligned or not, and the handshake kernel."""
    found = [Variant("handshake")]
    for world in worlds:
        for ndev in ndevs:
            for op in OPS:
                for dtype in ELEMENTS:
                    found += [Variant("collective", op, dtype, world, ndev, a) for a in (True, False)]
    return found


def local_build_line(capability: int, compile_one=None) -> str:
    """Whether the local Triton builds arxg's kernels for the local GPU (`compile_one(capability)` builds one
    kernel; tests pass a fake), and what to set when its ptxas is too old."""
    arch = arch_name(capability)
    compile_one = compile_one or (lambda cap: build_variant(Variant("handshake"), cap))
    try:
        version = triton_version()
    except ImportError as exc:
        return f"cannot build: Triton is not importable ({exc})"
    try:
        compile_one(capability)
    except Exception as exc:  # doctor reports, it never fails
        first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
        ptxas = os.environ.get("TRITON_PTXAS_PATH")
        hint = (
            f"TRITON_PTXAS_PATH={ptxas} is set: that ptxas must know {arch}"
            if ptxas
            else f"if its ptxas is too old for {arch}, set TRITON_PTXAS_PATH to a newer ptxas (CUDA 13's knows sm_121a)"
        )
        return f"Triton {version} cannot build for {arch}: {first[:200]}; {hint}"
    via = f" (ptxas from TRITON_PTXAS_PATH={os.environ['TRITON_PTXAS_PATH']})" if os.environ.get("TRITON_PTXAS_PATH") else ""
    return f"Triton {version} builds arxg's handshake kernel for {arch} here{via}"


def main(argv: list[str] | None = None) -> int:
    from arxtune.runtime.rdma.graph import images

    ap = argparse.ArgumentParser(
        description="Build arxg's kernels for a GPU arch into a directory that ARXTUNE_ARXG_KERNELS can point at (no GPU needed)."
    )
    ap.add_argument("--arch", required=True, choices=sorted(TARGETS), help="the GPU's arch, e.g. sm_121a (GB10)")
    ap.add_argument("--world", type=int, nargs="+", default=[2], help="world sizes to build for (default 2)")
    ap.add_argument("--ndev", type=int, nargs="+", default=[1, 2], help="RDMA devices per rank (default 1 2)")
    ap.add_argument("--out", type=Path, required=True, help="directory to write")
    a = ap.parse_args(argv)
    bad = [w for w in a.world if not 1 <= w <= abi.MAX_WORLD] + [d for d in a.ndev if not 1 <= d <= 16]
    if bad:
        print(f"aot: world sizes must be 1-{abi.MAX_WORLD} and device counts 1-16, not {bad[0]}", file=sys.stderr)
        return 2
    store = images.Store(a.out)
    variants = bundle_variants(tuple(a.world), tuple(a.ndev))
    for i, v in enumerate(variants, 1):
        path = store.put(build_variant(v, TARGETS[a.arch], images.source_hash()))
        print(f"[{i}/{len(variants)}] {path}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
