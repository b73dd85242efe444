"""A doctor row: what was checked, how it stands, what was found, and the one-line fix."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

OK, WARN, FAIL, INFO = "ok", "warn", "fail", "info"
#: How each status reads in the text table; FAIL is what makes doctor exit 1.
LABELS = {OK: "ok", WARN: "WARN", FAIL: "FAIL", INFO: "--"}


@dataclass(frozen=True)
class Row:
    item: str  # "pyverbs", "rocep1s0f1 port 1", ...
    status: str  # ok | warn | fail | info
    finding: str
    fix: str = ""  # what to do, one line (warn and fail rows)
    data: dict = field(default_factory=dict)  # the same facts as data: --json, the report, the group table

    def as_dict(self) -> dict:
        return asdict(self)


def format_rows(rows: list[Row]) -> str:
    """The text table: item, status, finding; a fix on the line below its row."""
    width = max((len(r.item) for r in rows), default=0)
    lines = []
    for r in rows:
        lines.append(f"{r.item.ljust(width)}  {LABELS[r.status].ljust(4)}  {r.finding}")
        if r.fix:
            lines.append(f"{''.ljust(width)}  {''.ljust(4)}  fix: {r.fix}")
    return "\n".join(lines)


def failed(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.status == FAIL]
