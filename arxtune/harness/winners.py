"""Which backend wins each measured size: the measured decision rule calibrate and compare use.

At each size the baseline keeps the point unless a challenger beats it
clearly: its pooled median beats the baseline's by more than `margin`, and
so does the median over rounds of its time over the baseline's in the same
round, in enough rounds that a tie would rarely do as well (the runtime's
rule, arxtune.runtime.faster). The backends take turns within a round, so a round compares them
under the same conditions and drift between rounds cancels; the median over
rounds lets a minority of bad rounds (a rank descheduled while it spins)
pass without deciding anything. Points without paired rounds (one round, or
different counts) need the challenger's interval (the spread of its round
medians) wholly below the baseline's instead. Two backends within the margin
of each other therefore leave the baseline in place. A challenger must also
win at least MIN_RUN consecutive measured sizes: a lone win between sizes the
baseline keeps is taken for noise, not a crossover. Likewise, fewer than
MIN_RUN sizes the baseline keeps between two runs of one challenger go to
that challenger where its median still beats the baseline's by the margin
(bad rounds kept its win from being clear there): one noisy size does not cut
a sustained win in two. Where the baseline has no correct result, the
fastest correct backend serves.
"""

from __future__ import annotations

import pandas as pd

from arxtune.runtime.faster import PointTimes
from arxtune.runtime.faster import clearly_faster as point_clearly_faster

#: Consecutive measured sizes a challenger must win to displace the baseline.
MIN_RUN = 2


def _times(row) -> PointTimes:
    rounds = row.get("round_medians_us")
    return PointTimes(
        float(row.median_us), tuple(rounds) if isinstance(rounds, (tuple, list)) else (), float(row.ci_low_us), float(row.ci_high_us)
    )


def clearly_faster(challenger, base, margin: float) -> bool:
    """Whether one point (a frame row) beats the baseline's at the same size with confidence (the runtime's rule)."""
    return point_clearly_faster(_times(challenger), _times(base), margin)


def size_winner(rows: pd.DataFrame, baseline: str, margin: float) -> str | None:
    """The backend for one size by itself, before the run-length rule."""
    if rows.empty:
        return None
    base = rows[rows.backend == baseline]
    if base.empty:
        return str(rows.loc[rows.median_us.idxmin(), "backend"])
    b = base.iloc[0]
    better = rows[[row.backend != baseline and clearly_faster(row, b, margin) for _, row in rows.iterrows()]]
    return baseline if better.empty else str(better.loc[better.median_us.idxmin(), "backend"])


def _runs(choices: list[str]) -> list[tuple[int, int]]:
    """(first, last) index of each run of one backend, in order."""
    runs, start = [], 0
    while start < len(choices):
        end = start
        while end + 1 < len(choices) and choices[end + 1] == choices[start]:
            end += 1
        runs.append((start, end))
        start = end + 1
    return runs


def sustained(choices: list[str], baseline: str, displaced: set[int], min_run: int = MIN_RUN) -> list[str]:
    """Runs of one challenger shorter than `min_run` go back to the baseline (except where it had no result)."""
    result = list(choices)
    for start, end in _runs(choices):
        if choices[start] != baseline and end - start + 1 < min_run:
            for i in range(start, end + 1):
                if i not in displaced:
                    result[i] = baseline
    return result


def bridged(choices: list[str], baseline: str, faster: list[set[str]], min_run: int = MIN_RUN) -> list[str]:
    """Runs of the baseline shorter than `min_run` between runs of one challenger go to it, at the
    sizes where `faster` (per size: the backends whose median beats the baseline's by the margin) has it."""
    result = list(choices)
    for start, end in _runs(choices):
        if (
            choices[start] == baseline
            and end - start + 1 < min_run
            and 0 < start
            and end + 1 < len(choices)
            and choices[start - 1] == choices[end + 1] != baseline
            and all(choices[start - 1] in faster[i] for i in range(start, end + 1))
        ):
            result[start : end + 1] = [choices[start - 1]] * (end - start + 1)
    return result


def measured_winners(frame: pd.DataFrame, baseline: str, margin: float, min_run: int = MIN_RUN) -> list[tuple[int, str]]:
    """(nbytes, backend) per measured size, ascending, for one (op, dtype, view).

    `frame` holds that slice's correct points with their summaries (Run.frame()).
    """
    sizes, choices, no_baseline, faster = [], [], set(), []
    for nbytes, rows in frame.groupby("nbytes", sort=True):
        winner = size_winner(rows, baseline, margin)
        if winner is None:
            continue
        base = rows[rows.backend == baseline]
        if base.empty:
            no_baseline.add(len(choices))
        faster.append(set() if base.empty else set(rows[rows.median_us * (1 + margin) < base.median_us.iloc[0]].backend))
        sizes.append(int(nbytes))
        choices.append(winner)
    return list(zip(sizes, bridged(sustained(choices, baseline, no_baseline, min_run), baseline, faster, min_run)))
