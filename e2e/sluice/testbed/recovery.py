"""How long a fault kept a streaming query's output from advancing, read from its checkpoint's commit log.

Spark writes `commits/<batch>` when a batch's output is done, so the files' modification times are the
moments the query's output advanced. A fault from `start` to `end` (a kill: both the same instant) cost the
longest stretch without such a moment from `start` until the first commit after `end`.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path


def commit_times(commit_log: Path) -> list[float]:
    """When each batch in a query's commit log was committed (seconds since the epoch), in order."""
    return sorted(f.stat().st_mtime for f in commit_log.iterdir() if f.name.isdigit())


def output_pause(commits: Sequence[float], start: float, end: float | None = None) -> float | None:
    """The longest time without a committed batch from the fault's start until the first commit after its
    end; None if the output never advanced after it."""
    end = start if end is None else end
    first_after = min((t for t in commits if t > end), default=None)
    if first_after is None:
        return None
    moments = [start, *sorted(t for t in commits if start < t < first_after), first_after]
    return max(later - earlier for earlier, later in pairwise(moments))


def pauses_summary(pauses: Sequence[float | None]) -> dict[str, object]:
    """Per fault, the output's pause in seconds (None: never recovered), with their median and maximum."""
    done = sorted(p for p in pauses if p is not None)
    return {
        "per_fault_s": [None if p is None else round(p, 1) for p in pauses],
        "median_s": round(done[len(done) // 2], 1) if done else None,
        "max_s": round(done[-1], 1) if done else None,
        "never_recovered": sum(1 for p in pauses if p is None),
    }
