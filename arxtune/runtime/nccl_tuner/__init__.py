"""arxtune's NCCL tuner plugin (arxtune_tuner.c) and the policy file it reads.

The plugin hands NCCL, per collective and size, the algorithm, protocol and
channel count that won the calibration among NCCL variants (`nccl[...]`
backends). Two environment variables turn it on in any NCCL program (vLLM,
torch, nccl-tests): NCCL_TUNER_PLUGIN=<the .so `build()` returns> and
NCCL_TUNER_CONFIG_FILE=<the CSV `tuner_csv()` writes>.

The CSV has the columns of NCCL's example plugin, one rule per line, first
match wins, -1 a wildcard:
collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff
Both byte bounds are inclusive; max_bytes -1 means no upper bound.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from arxtune.runtime import native
from arxtune.runtime.backends import split_name
from arxtune.runtime.backends.nccl_variant import NcclVariant
from arxtune.runtime.errors import ArxtuneError
from arxtune.runtime.thresholds import Range, Thresholds, merge_adjacent

SOURCE = Path(__file__).with_name("arxtune_tuner.c")
PLUGIN_ENV = "NCCL_TUNER_PLUGIN"
CONFIG_ENV = "NCCL_TUNER_CONFIG_FILE"
COLUMNS = ("collective", "min_bytes", "max_bytes", "algorithm", "protocol", "channels", "nNodes", "nRanks", "numPipeOps", "regBuff")
#: arxtune's op -> NCCL's collective name as the example plugin's files spell it.
COLLECTIVES = {"all_reduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter"}
#: The dtype whose table is exported when none is named: what serving usually moves first.
DTYPE_PREFERENCE = ("bfloat16", "float16", "float32", "int32")


def build() -> Path:
    """The plugin's shared library, compiled on first use like arxtune's other C helpers."""
    try:
        return native.build(SOURCE)
    except OSError as exc:
        raise ArxtuneError(f"cannot build the NCCL tuner plugin ({exc}); install a C compiler (cc) or set CC") from None


@dataclass(frozen=True)
class TunerExport:
    text: str  # the CSV file's contents
    rules: int  # lines that set something (the rest of each table is left to NCCL)
    mode: str
    dtypes: dict  # (op, world size) -> the dtype whose table was exported


def _dtype(available: set[str], wanted: str | None, where: str) -> str:
    if wanted is not None:
        if wanted not in available:
            raise ArxtuneError(f"{where} has no {wanted} table (it has {', '.join(sorted(available))}); pick one with --tuner-dtype")
        return wanted
    return next((d for d in DTYPE_PREFERENCE if d in available), sorted(available)[0])


def tuner_csv(thresholds: Thresholds, mode: str = "eager", dtype: str | None = None) -> TunerExport:
    """The NCCL part of a thresholds file as the plugin's CSV: one rule per run of sizes an NCCL variant won.

    NCCL's tuner sees neither dtype nor whether a graph is captured, so one
    table per (op, world size) is exported: `mode`'s, for `dtype` (default:
    the first of DTYPE_PREFERENCE the file has). Ranges that plain `nccl` or a
    non-NCCL backend won get no rule: NCCL keeps its own choice there.
    """
    tables = [t for t in thresholds.tables if t.mode == mode]
    if not tables:
        raise ArxtuneError(f"the thresholds have no {mode} tables; pick another with --tuner-mode")
    chosen: dict[tuple[str, int], str] = {}
    for op, world in sorted({(t.op, t.world_size) for t in tables}):
        chosen[(op, world)] = _dtype({t.dtype for t in tables if (t.op, t.world_size) == (op, world)}, dtype, f"{op} at world size {world}")
    lines = [
        f"# arxtune NCCL tuner policy from runs {', '.join(thresholds.provenance.get('runs', [])) or '?'}: the {mode} tables, "
        + ", ".join(f"{op} w{world} {d}" for (op, world), d in chosen.items()),
        "# " + ",".join(COLUMNS),
    ]
    rules = 0
    for t in sorted(tables, key=lambda t: (t.op, t.world_size)):
        if chosen[(t.op, t.world_size)] != t.dtype:
            continue
        run = thresholds.run(t.run_id)
        nodes = len(set(run.fingerprint.hostnames)) if run and run.fingerprint.hostnames else -1
        for r in merge_adjacent([Range(r.lo, r.hi, r.backend) for r in t.ranges]):  # measured and model ranges alike
            try:
                base, settings = split_name(r.backend)
                v = NcclVariant.parse(settings) if base == "nccl" and settings else None
            except ValueError as exc:
                raise ArxtuneError(f"table {t.mode}/{t.op}/{t.dtype}/w{t.world_size}: {exc}") from None
            if v is None:
                continue
            fields = (
                COLLECTIVES[t.op],
                r.lo,
                -1 if r.hi is None else r.hi - 1,
                v.algo or -1,
                v.proto or -1,
                v.channels or -1,
                nodes,
                t.world_size,
                -1,
                -1,
            )
            lines.append(",".join(map(str, fields)))
            rules += 1
    return TunerExport("\n".join(lines) + "\n", rules, mode, chosen)


def is_tuner_file(path: Path) -> bool:
    """Whether an existing file is a policy file this module wrote, which a new export may replace."""
    try:
        with open(path, "rb") as f:
            return f.read(64).startswith(b"# arxtune NCCL tuner policy")
    except OSError:
        return False
