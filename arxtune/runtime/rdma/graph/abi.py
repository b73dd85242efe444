"""A built arxg kernel as the driver sees it, and how its arguments are packed; no Triton needed.

A `KernelImage` is one compiled variant of a kernel (cubin for one arch) with
what launching it takes, all read from the compiled kernel itself when it was
built (aot.py):
- `args`: the kernel's own arguments that survived compilation, in order, with
  their Triton types (the source signature minus its constexprs);
- `params`: the byte size of every parameter of the compiled entry point, read
  from its PTX `.entry` declaration: the arguments, then whatever the compiler
  appended (newer Tritons add scratch pointers: global, then profile);
- `scratch`: the compiled kernel's scratch sizes by kind; an appended parameter
  is a scratch pointer, passed as NULL, which needs every scratch size to be 0.

So the packing follows the kernel that was built, whatever Triton built it,
and `check` refuses a kernel whose parameters it cannot account for.
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

#: What the kernels are specialised on that the launcher must know: elements per program, warps per program,
#: and the most ranks the sources table holds.
BLOCK = 1024
NUM_WARPS = 1
MAX_WORLD = 16

FORMAT, VERSION = "arxtune-arxg-kernel", 1
#: Triton argument types -> bytes of their parameter; pointers are 8
TYPE_BYTES = {"i1": 1, "i8": 1, "u8": 1, "i16": 2, "u16": 2, "i32": 4, "u32": 4, "i64": 8, "u64": 8, "fp32": 4, "fp64": 8}
_PARAM = re.compile(r"\.param\s+(?:\.align\s+(\d+)\s+)?\.(\w+)(?:\s+\.ptr(?:\s+\.\w+)*(?:\s+\.align\s+\d+)?)?\s+(\w+)(?:\[(\d+)\])?")
_BITS = {
    "u8": 1,
    "s8": 1,
    "b8": 1,
    "u16": 2,
    "s16": 2,
    "b16": 2,
    "u32": 4,
    "s32": 4,
    "b32": 4,
    "f32": 4,
    "u64": 8,
    "s64": 8,
    "b64": 8,
    "f64": 8,
}


class AbiError(ValueError):
    """A compiled kernel whose parameters this launcher cannot account for."""


def entry_params(ptx: str, name: str) -> list[int]:
    """The byte size of each parameter of entry `name`, in order, from its PTX declaration."""
    m = re.search(r"\.entry\s+" + re.escape(name) + r"\s*\((.*?)\)", ptx, re.S)
    if m is None:
        raise AbiError(f"no .entry {name} in the PTX")
    sizes = []
    for decl in filter(None, (d.strip() for d in m.group(1).split(","))):
        p = _PARAM.match(decl)
        if p is None or p.group(2) not in _BITS:
            raise AbiError(f"cannot read the parameter {decl!r} of {name}")
        width = _BITS[p.group(2)]
        sizes.append(width * int(p.group(4)) if p.group(4) else width)
    return sizes


def arg_bytes(triton_type: str) -> int:
    if triton_type.startswith("*"):
        return 8
    if triton_type not in TYPE_BYTES:
        raise AbiError(f"argument type {triton_type!r} has no known size")
    return TYPE_BYTES[triton_type]


@dataclass(frozen=True)
class KernelImage:
    name: str  # the entry point
    variant: str  # which specialisation (aot.variant_name)
    arch: str  # e.g. "sm_90a"
    source: str  # hash of the kernel source it was built from (images.source_hash)
    triton: str  # the Triton version that built it
    num_warps: int
    shared: int  # dynamic shared memory, bytes
    args: tuple[tuple[str, str], ...]  # (name, Triton type) of each runtime argument, in order
    params: tuple[int, ...]  # bytes of each parameter of the compiled entry point
    scratch: dict = field(default_factory=dict)  # kind -> bytes the kernel needs (global_scratch_size, ...)
    launch: dict = field(default_factory=dict)  # what a plain cuLaunchKernel cannot do: num_ctas, cooperative, pdl
    cubin: bytes = b""

    def check(self) -> None:
        """Raise AbiError unless a plain launch with `args` then NULL scratch pointers fits this kernel."""
        n = len(self.args)
        if len(self.params) < n:
            raise AbiError(f"{self.name}: the compiled entry has {len(self.params)} parameters for {n} arguments")
        for i, (arg, kind) in enumerate(self.args):
            if arg_bytes(kind) != self.params[i]:
                raise AbiError(f"{self.name}: argument {arg} ({kind}) does not fit parameter {i} of {self.params[i]} bytes")
        extra = self.params[n:]
        if len(extra) > len(self.scratch) or any(size != 8 for size in extra):
            raise AbiError(
                f"{self.name}: {len(extra)} parameters after the arguments ({list(extra)} bytes), but the "
                f"kernel names {len(self.scratch)} scratch kinds ({', '.join(self.scratch) or 'none'})"
            )
        used = {k: v for k, v in self.scratch.items() if v}
        if used:
            raise AbiError(f"{self.name}: needs scratch memory {used}; this launcher passes none")
        if self.launch.get("num_ctas", 1) != 1 or self.launch.get("cooperative") or self.launch.get("pdl"):
            raise AbiError(f"{self.name}: needs a launch this launcher does not make ({self.launch})")
        if 32 * self.num_warps > 1024:
            raise AbiError(f"{self.name}: {self.num_warps} warps exceed a block")

    def values(self, named: dict) -> list[int]:
        """Every parameter's value in order: the named arguments (pointers as integers), then 0 (NULL) for each
        scratch pointer."""
        missing = [a for a, _ in self.args if a not in named]
        if missing:
            raise AbiError(f"{self.name}: missing arguments {missing}")
        return [int(named[a]) for a, _ in self.args] + [0] * (len(self.params) - len(self.args))

    def to_json(self) -> str:
        d = asdict(self)
        d["cubin"] = base64.b64encode(self.cubin).decode()
        return json.dumps({"format": FORMAT, "version": VERSION, **d}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "KernelImage":
        d = json.loads(text)
        if d.pop("format", None) != FORMAT or d.pop("version", None) != VERSION:
            raise AbiError(f"not an {FORMAT} file of version {VERSION}")
        d["cubin"] = base64.b64decode(d["cubin"])
        d["args"] = tuple(tuple(a) for a in d["args"])
        d["params"] = tuple(d["params"])
        return cls(**d)

    @classmethod
    def read(cls, path: Path) -> "KernelImage":
        try:
            return cls.from_json(path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise AbiError(f"{path}: {exc}") from None
