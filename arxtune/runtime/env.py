"""Every ARXTUNE_* environment variable, declared once with its meaning.

Code reads a variable only through its declaration here (`THRESHOLDS.get()`),
so `arxtune doctor`, the docs and a test can list them all. Every variable
must be the same on every rank of a group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping


@dataclass(frozen=True)
class Variable:
    name: str
    default: str
    meaning: str
    choices: tuple[str, ...] = ()  # the values it may take (case-insensitive); empty: any
    #: Whether it decides which collectives a group runs: the ranks compare it before their first one (`differences`).
    agreed: bool = False

    def get(self, environ: Mapping[str, str] | None = None) -> str:
        """The value with surrounding blanks removed; the default when unset or blank.

        A value outside `choices` is an ArxtuneError (a typo such as strcit must not read as the default)."""
        value = (os.environ if environ is None else environ).get(self.name, "").strip() or self.default
        if self.choices and value.lower() not in self.choices:
            from arxtune.runtime.errors import ArxtuneError

            raise ArxtuneError(f"{self.name}={value!r} is not one of {', '.join(self.choices)}; fix or unset it")
        return value

    def is_set(self, environ: Mapping[str, str] | None = None) -> bool:
        return bool((os.environ if environ is None else environ).get(self.name, "").strip())


VARIABLES: dict[str, Variable] = {}


def _declare(name: str, default: str, meaning: str, choices: tuple[str, ...] = (), agreed: bool = False) -> Variable:
    variable = Variable(name, default, meaning, choices, agreed)
    VARIABLES[name] = variable
    return variable


# -- the runtime: which file, how it is trusted, what is overridden
THRESHOLDS = _declare(
    "ARXTUNE_THRESHOLDS",
    "",
    "the thresholds file the communicator and the vLLM plugin load "
    "(default ~/.config/arxtune/thresholds.json, where `arxtune calibrate RUN --install` writes)",
)
OVERRIDES = _declare(
    "ARXTUNE_OVERRIDES",
    "",
    "ranges laid over the calibrated tables: OP[/DTYPE][@MODE]:LO-[HI]=BACKEND, items separated by ',' or ';'",
    agreed=True,
)
FINGERPRINT = _declare(
    "ARXTUNE_FINGERPRINT",
    "warn",
    "warn: name what differs from the run a file was measured on and use it; strict: fall back to the baseline instead",
    ("warn", "strict"),
    agreed=True,
)
EXTRA_BACKENDS = _declare("ARXTUNE_EXTRA_BACKENDS", "", "site backends added to the registry: name=package.module:Class, ...", agreed=True)
# -- the start-up ladder (arxtune.runtime.ladder)
BOOT = _declare(
    "ARXTUNE_BOOT",
    "check",
    "off: trust the thresholds file; check: time each boundary on the live group at "
    "start-up and say whether it held; adjust: also move a contradicted boundary (and, with no file, build tables)",
    agreed=True,
)
BOOT_BUDGET_S = _declare(
    "ARXTUNE_BOOT_BUDGET_S",
    "1",
    "seconds the start-up ladder may spend in all, opening the backends it alone needs included (their own timeouts come on top)",
    agreed=True,
)
BOOT_OUT = _declare("ARXTUNE_BOOT_OUT", "", "where rank 0 writes the ladder's run (default ~/.cache/arxtune/boot/)")
# -- serving
VERIFY = _declare(
    "ARXTUNE_VERIFY",
    "",
    "N: every Nth call of each backend is made again through the baseline and "
    "compared; one that differs serves nothing of that op and dtype for the rest of the process (default: off)",
    agreed=True,
)
# -- the vLLM plugin
VLLM_DISABLE = _declare("ARXTUNE_VLLM_DISABLE", "", "1: the plugin installs nothing and vLLM keeps its own communicator")
VLLM_LOG = _declare(
    "ARXTUNE_VLLM_LOG", "info", "what the plugin logs: info (start-up line and warnings), calls (also one line per TP call), warning, error"
)
# -- devices and native code
REQUIRE_GPU = _declare(
    "ARXTUNE_REQUIRE_GPU",
    "0",
    "1: the GPU tier (tests/gpu) fails where no CUDA GPU would make it skip (scripts/gpu-arxg.sh sets it)",
    ("0", "1"),
)
DEVICE = _declare("ARXTUNE_DEVICE", "", "cpu: use CPU tensors even where GPUs exist")
NCCL_LIBRARY = _declare("ARXTUNE_NCCL_LIBRARY", "", "the libnccl.so the nccl backend binds (default: the one torch loaded)")
NCCL_LOOP = _declare("ARXTUNE_NCCL_LOOP", "c", "python: launch nccl's eager samples from Python instead of its C loop", ("c", "python"))
ARXG_NATIVE = _declare("ARXTUNE_ARXG_NATIVE", "1", "0: arxg's proxy steps in Python instead of its C loop", ("0", "1"))
ARXG_KERNELS = _declare(
    "ARXTUNE_ARXG_KERNELS",
    "",
    "directories of arxg kernel builds made elsewhere (python -m "
    "arxtune.runtime.rdma.graph.aot), searched before the cache; separated by ':'",
)
ARXG_SPIN_US = _declare(
    "ARXTUNE_ARXG_SPIN_US",
    "5000",
    "microseconds arxg's proxy polls for the next step after its last one (a CPU core each while it polls) before it blocks",
)
ARXG_NAP_US = _declare(
    "ARXTUNE_ARXG_NAP_US",
    "100",
    "once blocked, arxg's proxy looks for a step at least this often (microseconds); an eager call wakes it at once",
)
# -- the arx RDMA transport (arxtune.runtime.rdma.config)
RDMA_DEVICES = _declare("ARXTUNE_RDMA_DEVICES", "", "RDMA devices to use, comma-separated (default: every active RoCE v2 port)")
RDMA_PORT = _declare("ARXTUNE_RDMA_PORT", "", "the RDMA device port (default 1)")
RDMA_GID_INDEX = _declare("ARXTUNE_RDMA_GID_INDEX", "", "the GID index (default: the port's RoCE v2 IPv4 GID)")
RDMA_MAX_BYTES = _declare("ARXTUNE_RDMA_MAX_BYTES", "", "the largest message the pre-registered buffers hold")
RDMA_TIMEOUT_S = _declare("ARXTUNE_RDMA_TIMEOUT_S", "", "how long an RDMA wait lasts before it is an error")


def agreed_values(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """(name, value as set) of every variable the ranks of a group must agree on."""
    environ = os.environ if environ is None else environ
    return tuple((v.name, environ.get(v.name, "").strip()) for v in VARIABLES.values() if v.agreed)


def differences(per_rank: list[tuple[tuple[str, str], ...]]) -> str:
    """'' when every rank's agreed_values() are the same; else one line naming each variable that differs."""
    said = []
    for name, _ in per_rank[0]:
        values = [dict(rank).get(name, "") for rank in per_rank]
        if len(set(values)) > 1:
            shown = ", ".join(f"rank {r}: {v[:80]!r}" for r, v in enumerate(values))
            said.append(f"{name} differs between ranks ({shown})")
    return "; ".join(said) + "; set the same value on every rank" if said else ""


def problems(environ: Mapping[str, str] | None = None) -> list[str]:
    """What is wrong with the variables that are set (values outside their choices), for doctor and start-up checks."""
    found = []
    for variable in VARIABLES.values():
        try:
            variable.get(environ)
        except Exception as exc:  # ArxtuneError; imported lazily above
            found.append(str(exc))
    return found


def describe() -> list[str]:
    """'NAME=value (meaning)' for every variable that is set, for doctor and bug reports."""
    return [f"{v.name}={os.environ[v.name]!r} ({v.meaning})" for v in VARIABLES.values() if v.is_set()]
