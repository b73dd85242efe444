"""The runtime's own router over a thresholds file, with every backend stood in by its name.

Calibrate's and the file format's tests ask it which backend a call would go
to: the same tables, lookup and bounds a deployment runs (arxtune.runtime.router),
with no backend opened.
"""

from __future__ import annotations

from arxtune.runtime.router import Router, mode_tables, resolve


class Named:
    """An opened backend that takes every op at every size and can be captured."""

    capturable = True

    def __init__(self, name: str):
        self.name = name

    def supports(self, op, dtype, nbytes) -> bool:
        return True


class FileRoutes:
    """choose(op, torch dtype, nbytes) -> the backend name the router picks, None where no table covers the call."""

    def __init__(self, thresholds, world_size: int, mode: str = "eager"):
        tables, _ = mode_tables(thresholds, world_size)
        names = {r.backend for ranges in tables.values() for r in ranges}
        self._routes = resolve(tables, {name: Named(name) for name in names}, lambda name: False)
        self._router = Router(self._routes, fallback="", capturing=lambda: mode == "graph")

    def __bool__(self) -> bool:
        return bool(self._routes)

    def choose(self, op: str, dtype, nbytes: int) -> str | None:
        backend = self._router.pick(op, dtype, nbytes)
        return None if backend is None else backend.name
