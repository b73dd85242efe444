"""Where a GPU rank's arxg kernels come from: a build found on disk, or one made here with Triton.

Builds are abi.KernelImage files, `<dir>/<source hash>/<arch>/<variant>.json`.
A rank looks for its variant in the directories ARXTUNE_ARXG_KERNELS names
(builds made elsewhere, `python -m arxtune.runtime.rdma.graph.aot`), then in
the per-user cache; where none is there it builds the variant with the local
Triton and caches it. So Triton is needed only to build: a host whose Triton is
absent, or too old for its GPU (a Spark with Triton 3.5 and sm_121a), runs from
a build made on any machine whose Triton knows the arch. The source hash covers
every file that decides what is built, so a build of other kernel code is
never loaded.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

from arxtune.runtime import env, native
from arxtune.runtime.rdma.errors import RdmaUnavailable
from arxtune.runtime.rdma.graph.abi import AbiError, KernelImage

_HERE = Path(__file__).parent
#: the files whose content decides a build
SOURCES = ("kernels.py", "abi.py", "aot.py", "segment.py")


def source_hash() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update((_HERE / name).read_bytes())
    return digest.hexdigest()[:16]


class Store:
    """A directory of builds."""

    def __init__(self, root: Path | str):
        self.root = Path(root)

    def path(self, source: str, arch: str, variant: str) -> Path:
        return self.root / source / arch / f"{variant}.json"

    def get(self, source: str, arch: str, variant: str) -> KernelImage | None:
        path = self.path(source, arch, variant)
        return KernelImage.read(path) if path.exists() else None

    def put(self, image: KernelImage) -> Path:
        """Write whole or not at all (ranks of one host may build the same variant at once)."""
        path = self.path(image.source, image.arch, image.variant)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w") as f:
                f.write(image.to_json())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return path


def cache() -> Store:
    return Store(native.cache_dir() / "arxg-kernels")


def stores() -> list[Store]:
    """Where builds are looked for, in order: ARXTUNE_ARXG_KERNELS's directories, then the cache."""
    given = [Store(p) for p in env.ARXG_KERNELS.get().split(os.pathsep) if p]
    return [*given, cache()]


def _default_build(variant, capability: int, source: str) -> KernelImage:
    from arxtune.runtime.rdma.graph import aot

    return aot.build_variant(variant, capability, source)


def _why_no_build(capability: int) -> str | None:
    """Why the local Triton cannot build (None: it may try)."""
    from arxtune.runtime.rdma.graph import aot

    try:
        version = aot.triton_version()
    except ImportError:
        return "Triton is not installed here"
    if aot.triton_too_old(version):
        return f"Triton {version} here is older than {'.'.join(map(str, aot.MIN_TRITON))}"
    return None


def obtain(
    variant, capability: int, build=_default_build, searched: list[Store] | None = None, why_no_build=_why_no_build
) -> tuple[KernelImage, str]:
    """(the image of `variant` for compute capability `capability`, where it came from).

    RdmaUnavailable says what is missing and how to make a build elsewhere."""
    from arxtune.runtime.rdma.graph.aot import arch_name

    arch, source = arch_name(capability), source_hash()
    searched = stores() if searched is None else searched
    for store in searched:
        try:
            image = store.get(source, arch, variant.name)
            if image is not None:
                image.check()
                return image, f"the build in {store.root}, made by Triton {image.triton}"
        except AbiError as exc:
            raise RdmaUnavailable(f"arxg: the build {store.path(source, arch, variant.name)} cannot be launched: {exc}") from None
    why = why_no_build(capability)
    if why is None:
        try:
            image = build(variant, capability, source)
        except Exception as exc:  # a build failure is the reason this backend cannot run here
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
            why = f"the local build failed: {first[:300]}"
        else:
            target = searched[-1] if searched else cache()
            try:
                target.put(image)
            except OSError:
                pass  # a cache that cannot be written costs a build next time, nothing more
            return image, f"built here by Triton {image.triton}"
    raise RdmaUnavailable(
        f"arxg: no build of {variant.name} for {arch} (kernel source {source}) in {', '.join(str(s.root) for s in searched)}, "
        f"and {why}. Build one on a machine whose Triton (>= 3.6) knows {arch}: python -m arxtune.runtime.rdma.graph.aot "
        f"--arch {arch} --world {variant.world} --ndev {variant.ndev} --out DIR, copy DIR here and set "
        f"{env.ARXG_KERNELS.name}=DIR"
    )


def doctor_line(capability: int, build=_default_build) -> str:
    """Which build of arxg's handshake kernel a GPU of this capability loads here, and how it got there."""
    from arxtune.runtime.rdma.graph.aot import Variant, arch_name

    try:
        _, how = obtain(Variant("handshake"), capability, build=build)
    except RdmaUnavailable as exc:
        return f"none for {arch_name(capability)}: {str(exc).removeprefix('arxg: ')}"
    return f"{arch_name(capability)}: {how}"
