"""topN per window, once each window is final: `limit` rows (ROW_NUMBER) by default, or with `ties: true` every
row whose rank (SQL RANK) is at most `limit`. References are computed here from the input rows."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest
from rows import at, run, sorted_rows, table, unique, window_totals

pytestmark = pytest.mark.spark

SECOND = 1000
LIMIT = 2


def pipeline(name: str, ties: bool | None) -> dict:
    top: dict = {"limit": LIMIT, "orderBy": ["points DESC"]}
    if ties is not None:
        top["ties"] = ties
    return {
        "nodes": [
            *window_totals(),
            {"name": "top", "inputs": ["totals"], "topN": top},
            {"name": "ranked", "inputs": ["top"], "select": ["window_start", "player", "points"]},
            {"name": "out", "inputs": ["ranked"], "toMemory": {"table": name}},
        ]
    }


def scores(rows) -> dict[int, dict[str, int]]:
    """Three windows of small scores (many ties), in one batch per window; the totals per window and player."""
    rng = random.Random(3)
    totals: dict[int, dict[str, int]] = defaultdict(Counter)
    for window in range(3):
        batch = []
        for _ in range(12):
            player, points, second = rng.choice("abcdef"), rng.randint(1, 2), window * 10 + rng.randrange(10)
            batch.append({"player": player, "points": points, "ts": at(second)})
            totals[window * 10 * SECOND][player] += points
        rows.batch("scores", batch)
    rows.batch("scores", [{"player": "z", "points": 0, "ts": at(100)}])
    rows.batch("scores", [{"player": "z", "points": 0, "ts": at(101)}])
    return totals


@pytest.mark.parametrize("ties", [None, False])
def test_top_n_keeps_limit_rows_per_window_by_default(spark_session, rows, tmp_path, ties):
    totals = scores(rows)
    name = unique("top")
    run(spark_session, pipeline(name, ties), rows, tmp_path / "cp")
    kept: dict[int, list[int]] = defaultdict(list)
    for row in table(spark_session, name):
        kept[row["window_start"]].append(row["points"])
    # which of several tied rows is kept is arbitrary; the points kept are the `limit` highest
    assert {w: sorted(p, reverse=True) for w, p in kept.items()} == {
        w: sorted(t.values(), reverse=True)[:LIMIT] for w, t in totals.items()
    }


def test_top_n_with_ties_keeps_every_row_ranked_within_the_limit(spark_session, rows, tmp_path):
    totals = scores(rows)
    name = unique("ties")
    run(spark_session, pipeline(name, True), rows, tmp_path / "cp")
    expected = [
        {"window_start": window, "player": player, "points": points}
        for window, by_player in totals.items()
        for player, points in by_player.items()
        # SQL RANK: 1 + the number of rows ranked strictly before
        if 1 + sum(other > points for other in by_player.values()) <= LIMIT
    ]
    assert any(sum(r["window_start"] == w for r in expected) > LIMIT for w in totals)  # the data has ties
    assert table(spark_session, name) == sorted_rows(expected)
