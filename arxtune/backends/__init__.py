"""Backend registry: name -> module that defines it, imported on demand.

Importing lazily keeps optional dependencies (pyverbs, vLLM) out of start-up
and turns a missing one into a recorded reason instead of an ImportError.
"""

from __future__ import annotations

import importlib
import os

from .base import OPS, Backend, BackendUnavailable, GroupContext

#: backend name -> "module:Class"; the order is the order of sweeps and plots.
REGISTRY: dict[str, str] = {
    "gloo": "arxtune.backends.torch_dist:GlooBackend",
    "nccl": "arxtune.backends.torch_dist:NcclBackend",
    "arx": "arxtune.backends.arx:ArxOneShot",
    "arx2": "arxtune.backends.arx:ArxTwoShot",
    "arxg": "arxtune.backends.arx_graph:ArxGraph",
    "symm_mem": "arxtune.backends.symm_mem:SymmMemOneShot",
    "symm_mem2": "arxtune.backends.symm_mem:SymmMemTwoShot",
    "vllm_cpu": "arxtune.backends.vllm_cpu:VllmCpuBackend",
    "vllm_pynccl": "arxtune.backends.vllm_cuda:VllmPyNccl",
    "vllm_custom_ar": "arxtune.backends.vllm_cuda:VllmCustomAllreduce",
    "vllm_symm_mem": "arxtune.backends.vllm_cuda:VllmSymmMem",
}


ENV_EXTRA = "ARXTUNE_EXTRA_BACKENDS"


def register(name: str, target: str) -> None:
    """Add a backend defined outside arxtune ("package.module:Class"), e.g. a site-specific transport."""
    if ":" not in target:
        raise ValueError(f"backend target {target!r} must look like 'package.module:Class'")
    REGISTRY[name] = target


def _register_from_env() -> None:
    """ARXTUNE_EXTRA_BACKENDS="name=pkg.module:Class,..." adds backends in every rank torchrun starts."""
    for item in filter(None, os.environ.get(ENV_EXTRA, "").split(",")):
        name, _, target = item.partition("=")
        register(name.strip(), target.strip())


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


__all__ = ["OPS", "REGISTRY", "Backend", "BackendUnavailable", "GroupContext", "create", "names", "register"]
