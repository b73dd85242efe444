"""Backend registry: name -> module that defines it, imported on demand.

Importing lazily keeps optional dependencies (pyverbs, vLLM) out of start-up
and turns a missing one into a recorded reason instead of an ImportError.
"""

from __future__ import annotations

import importlib

from arxtune.runtime.backends.base import OPS, Backend, BackendUnavailable, GroupContext
from arxtune.runtime import env

#: backend name -> "module:Class"; the order is the order of sweeps and plots.
REGISTRY: dict[str, str] = {
    "gloo": "arxtune.runtime.backends.torch_dist:GlooBackend",
    "nccl": "arxtune.runtime.backends.nccl:NcclBackend",
    "torch_nccl": "arxtune.runtime.backends.torch_dist:TorchNcclBackend",
    "arx": "arxtune.runtime.backends.arx:ArxOneShot",
    "arx2": "arxtune.runtime.backends.arx:ArxTwoShot",
    "arxg": "arxtune.runtime.backends.arx_graph:ArxGraph",
    "symm_mem": "arxtune.runtime.backends.symm_mem:SymmMemOneShot",
    "symm_mem2": "arxtune.runtime.backends.symm_mem:SymmMemTwoShot",
    "vllm_cpu": "arxtune.runtime.backends.vllm_cpu:VllmCpuBackend",
    "vllm_pynccl": "arxtune.runtime.backends.vllm_cuda:VllmPyNccl",
    "vllm_custom_ar": "arxtune.runtime.backends.vllm_cuda:VllmCustomAllreduce",
    "vllm_symm_mem": "arxtune.runtime.backends.vllm_cuda:VllmSymmMem",
}


ENV_EXTRA = env.EXTRA_BACKENDS.name


def register(name: str, target: str) -> None:
    """Add a backend defined outside arxtune ("package.module:Class"), e.g. a site-specific transport."""
    if ":" not in target:
        raise ValueError(f"backend target {target!r} must look like 'package.module:Class'")
    REGISTRY[name] = target


def parse_extra(text: str) -> tuple[dict[str, str], list[str]]:
    """'name=pkg.module:Class,...' -> (backends to add, problems); a built-in name may not be replaced."""
    extra, problems = {}, []
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, equals, target = (part.strip() for part in item.partition("="))
        module, colon, cls = target.partition(":")
        if not (equals and name.isidentifier() and colon and module and cls.isidentifier()):
            problems.append(f"{item!r} must look like name=package.module:Class")
        elif name in BUILTIN or name in extra:
            problems.append(f"{name!r} is already a backend; pick another name")
        else:
            extra[name] = target
    return extra, problems


BUILTIN = frozenset(REGISTRY)
#: What was wrong with ARXTUNE_EXTRA_BACKENDS; commands that use backends refuse to start while it is set.
EXTRA_PROBLEMS: list[str] = []


def _register_from_env() -> None:
    """ARXTUNE_EXTRA_BACKENDS adds backends in every rank torchrun starts; a bad entry is kept as a problem, never raised at import."""
    extra, problems = parse_extra(env.EXTRA_BACKENDS.get())
    REGISTRY.update(extra)
    EXTRA_PROBLEMS[:] = problems


def check_extra() -> None:
    """Raise one ArxtuneError when ARXTUNE_EXTRA_BACKENDS could not be used as written."""
    if EXTRA_PROBLEMS:
        from arxtune.runtime.errors import ArxtuneError

        raise ArxtuneError(f"{ENV_EXTRA}: {'; '.join(EXTRA_PROBLEMS)}; fix or unset it")


_register_from_env()


def names() -> list[str]:
    return list(REGISTRY)


def backend_class(name: str) -> type:
    if name not in REGISTRY:
        raise KeyError(name)
    module_name, class_name = REGISTRY[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendUnavailable(f"cannot import {module_name}: {exc}") from exc
    return getattr(module, class_name)


def create(name: str, ctx: GroupContext) -> Backend:
    """Build a backend or raise BackendUnavailable with the reason."""
    return backend_class(name)(ctx)


__all__ = ["OPS", "REGISTRY", "Backend", "BackendUnavailable", "GroupContext", "check_extra", "create", "names", "register"]
