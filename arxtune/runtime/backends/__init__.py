"""Backend registry: name -> module that defines it, imported on demand.

Importing lazily keeps optional dependencies (pyverbs, vLLM) out of start-up
and turns a missing one into a recorded reason instead of an ImportError.

Variants: `base[key=value,...]` names the registered backend `base` opened
with those settings, e.g. `nccl[proto=LL,channels=4]`. A class that has
variants defines `parse_variant(settings: dict[str, str])`, which returns an
object with `settings()` (the canonical settings, what the name shows) or
raises ValueError, and takes that object as its constructor's `variant`. A
backend's `variants` option (`backend_options.nccl.variants = ["proto=LL"]`)
adds one such backend per entry after the base (`with_variants`).
"""

from __future__ import annotations

import importlib
import re

from arxtune.runtime.backends.base import OPS, Backend, BackendUnavailable
from arxtune.runtime.group import GroupContext
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
BUILTIN_ORDER = tuple(REGISTRY)
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


def _class_or_none(name: str) -> type | None:
    try:
        return backend_class(split_name(name)[0])
    except (KeyError, ValueError, BackendUnavailable):
        return None


def framework(name: str) -> str:
    """The framework whose own communicator `name` (or a variant of it) is (its class's `framework`), else ''."""
    return getattr(_class_or_none(name), "framework", "")


def why_not_here(name: str) -> str | None:
    """Why `name` cannot run on this box, asked of its class without a group: None when it may;
    KeyError when its class cannot tell without a group (no `why_not_here`)."""
    try:
        cls = backend_class(name)
    except BackendUnavailable as exc:
        return exc.reason
    ask = getattr(cls, "why_not_here", None)
    if ask is None:
        raise KeyError(name)
    return ask()


def check_options(name: str, options: dict) -> None:
    """Raise when `name`'s class refuses these options (its `check_options`); a class without one takes any."""
    check = getattr(_class_or_none(name), "check_options", None)
    if check is not None:
        check(options)


def start_up_candidates(device_type: str) -> tuple[str, ...]:
    """What the start-up ladder may time for a group without a file: the built-ins whose class names this device
    type in `start_up_candidate`, then every site backend (ARXTUNE_EXTRA_BACKENDS), opened to find out."""
    own = tuple(n for n in BUILTIN_ORDER if device_type in getattr(_class_or_none(n), "start_up_candidate", ()))
    return own + tuple(n for n in names() if n not in BUILTIN)


_VARIANT = re.compile(r"(?P<base>\w+)\[(?P<body>[^\[\]]*)\]")
#: A comma outside brackets: where lists of backend names split.
_NAME_SEPARATOR = re.compile(r",(?![^\[]*\])")


def split_names(text: str) -> list[str]:
    """'nccl,nccl[proto=LL,channels=4]' -> ['nccl', 'nccl[proto=LL,channels=4]']: commas inside brackets stay."""
    return [part.strip() for part in _NAME_SEPARATOR.split(text) if part.strip()]


def split_name(name: str) -> tuple[str, dict[str, str]]:
    """'nccl[proto=LL,channels=4]' -> ('nccl', {'proto': 'LL', 'channels': '4'}); a plain name -> (name, {})."""
    if "[" not in name and "]" not in name:
        return name, {}
    match = _VARIANT.fullmatch(name)
    if not match:
        raise ValueError(f"{name!r} must look like backend[key=value,...]")
    settings: dict[str, str] = {}
    for item in match["body"].split(","):
        key, equals, value = (part.strip() for part in item.partition("="))
        if not (equals and key and value) or key in settings:
            raise ValueError(f"{name!r}: each setting is key=value, each key once")
        settings[key] = value
    return match["base"], settings


def variant_of(name: str) -> tuple[type, object | None]:
    """The class behind `name` and its parsed variant (None for a plain name).

    KeyError: no such backend; ValueError: settings its class does not take;
    BackendUnavailable: its module does not import here."""
    base, settings = split_name(name)
    cls = backend_class(base)
    if not settings:
        return cls, None
    parse = getattr(cls, "parse_variant", None)
    if parse is None:
        raise ValueError(f"{base} has no variants")
    return cls, parse(settings)


def canonical(name: str) -> str:
    """The name a variant is recorded under: settings in the class's order and spelling. ValueError/KeyError as variant_of."""
    base, settings = split_name(name)
    if not settings:
        return name
    variant = variant_of(name)[1]
    return f"{base}[{','.join(f'{k}={v}' for k, v in variant.settings().items())}]"  # type: ignore[attr-defined]


def problem(name: str) -> str:
    """Why `name` cannot be opened as written ('' when it can), for config checks."""
    try:
        if split_name(name)[0] not in REGISTRY:
            return f"unknown backend {name!r}; known: {', '.join(names())}"
        if canonical(name) != name:
            return f"write {name!r} as {canonical(name)!r}"
    except (ValueError, BackendUnavailable) as exc:
        return str(getattr(exc, "reason", exc))
    return ""


def with_variants(wanted: tuple[str, ...] | list[str], options: dict) -> tuple[str, ...]:
    """The backends to open: each wanted one, followed by the variants its `variants` option lists. ValueError when one is bad."""
    found: list[str] = []
    for name in wanted:
        variants = options.get(name, {}).get("variants", []) if isinstance(options.get(name), dict) else []
        if not isinstance(variants, (list, tuple)) or not all(isinstance(v, str) for v in variants):
            raise ValueError(f"backend_options.{name}.variants must be a list of strings like \"proto=LL,channels=4\"")
        for each in (name, *(canonical(f"{name}[{v}]") for v in variants)):
            if each in found:
                raise ValueError(f"{each} is named twice")
            found.append(each)
    return tuple(found)


def create(name: str, ctx: GroupContext) -> Backend:
    """Build a backend (or a variant of one) or raise BackendUnavailable with the reason."""
    try:
        cls, variant = variant_of(name)
    except ValueError as exc:
        raise BackendUnavailable(str(exc)) from None
    return cls(ctx) if variant is None else cls(ctx, variant=variant)


__all__ = [
    "OPS",
    "REGISTRY",
    "Backend",
    "BackendUnavailable",
    "GroupContext",
    "canonical",
    "check_extra",
    "check_options",
    "create",
    "framework",
    "names",
    "problem",
    "register",
    "split_name",
    "split_names",
    "start_up_candidates",
    "why_not_here",
    "with_variants",
]
