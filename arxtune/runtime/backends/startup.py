"""Opening backends on every rank of a group, and agreeing on who could.

Used by the harness (sweep) and the runtime (communicator, vLLM plugin) alike:
a backend that fails on any rank is closed everywhere and its reason kept.
"""

from __future__ import annotations

import torch

from arxtune.runtime.backends import create, names
from arxtune.runtime.backends.base import OPS, Backend, BackendUnavailable
from arxtune.runtime.group import GroupContext, agreed_reason, gather_objects


def default_baseline(device: torch.device) -> str:
    """The torch.distributed backend for this device's tensors."""
    return "nccl" if device.type == "cuda" else "gloo"


def backend_capacity(backend: Backend) -> dict[str, int]:
    """op -> the largest bytes the backend takes, for backends that say (`capacity()`); none means no limit."""
    report = getattr(backend, "capacity", None)
    return {op: int(limit) for op, limit in (report() if callable(report) else {}).items() if limit is not None}


def open_backends(names_wanted: list[str] | tuple[str, ...], ctx: GroupContext) -> tuple[dict[str, Backend], dict[str, dict]]:
    """Create each named backend; one that fails on any rank is closed everywhere and its reason kept.

    The status of an open backend records what shaped it: `options` (as given
    in ctx) and `capacity` (op -> largest bytes), so runs and the runtime agree.
    """
    ready, status = {}, {}
    for name in names_wanted:
        backend, reason = None, ""
        try:
            backend = create(name, ctx)
        except BackendUnavailable as exc:
            reason = exc.reason
        except KeyError:
            reason = f"not a registered arxtune backend ({', '.join(names())})"
        except Exception as exc:  # a backend's own bug is reported like any other reason, never a crash
            reason = f"{type(exc).__name__}: {exc}"
        reason = agreed_reason(gather_objects(reason, ctx.cpu_group))
        if reason:
            if backend is not None:
                backend.close()
            status[name] = {"available": False, "reason": reason}
            continue
        ready[name] = backend
        status[name] = {
            "available": True,
            "reason": "",
            "capturable": bool(getattr(backend, "capturable", False)),
            "ops": list(getattr(backend, "ops", OPS)),
            "capacity": backend_capacity(backend),
            "options": _options(backend, ctx, name),
        }
    return ready, status


def _options(backend: Backend, ctx: GroupContext, name: str) -> dict:
    """The options the backend ran with: its own report (`effective_options()`) where it has one, else ctx's."""
    report = getattr(backend, "effective_options", None)
    return dict(report()) if callable(report) else ctx.options_for(name)
