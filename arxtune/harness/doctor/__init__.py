"""`arxtune doctor`: whether this box, and a group of boxes, can run a sweep, and the fix where not.

- One box (`checks.py`): a row per thing the field has seen go wrong, each OK or its fix in one line.
- Across the boxes (`group.py`): every rank's rows gathered on rank 0 as one table of what
  differs, an RDMA write ping-pong between each pair on each twin (`pingpong.py`), a verdict
  per pair.
- `--report FILE` (`report.py`): one archive with all of it, nothing secret, to attach to a report.
"""

from __future__ import annotations

from arxtune.harness.doctor.checks import CHECKS, Check, arxg_rows, backend_reasons, endpoints, run
from arxtune.harness.doctor.host import Host
from arxtune.harness.doctor.rows import FAIL, INFO, OK, WARN, Row, failed, format_rows

__all__ = [
    "CHECKS",
    "Check",
    "FAIL",
    "Host",
    "INFO",
    "OK",
    "Row",
    "WARN",
    "arxg_rows",
    "backend_reasons",
    "doctor",
    "endpoints",
    "failed",
    "format_rows",
    "run",
]


def doctor(host: Host | None = None) -> list[Row]:
    """The rows for this box (every check of CHECKS)."""
    return run(host)
