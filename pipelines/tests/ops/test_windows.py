"""Sliding and session windows over event time with a watermark (append mode: each window once, when it
closes). Records of the key `z` only move the watermark: their windows never close."""

from __future__ import annotations

import pytest
from rows import at, run, sorted_rows, table, unique

pytestmark = pytest.mark.spark

SECOND = 1000


def windowed(window: dict, table_name: str) -> dict:
    return {
        "nodes": [
            {
                "name": "events",
                "fromKafka": {
                    "topic": "events",
                    "format": "json",
                    "schema": "word STRING, ts TIMESTAMP",
                    "eventTime": "ts",
                    "watermark": "1s",
                },
            },
            {
                "name": "counts",
                "inputs": ["events"],
                "aggregate": {"groupBy": ["word"], "window": window, "aggregations": {"n": "count(*)"}},
            },
            {"name": "out", "inputs": ["counts"], "toMemory": {"table": table_name}},
        ]
    }


def events(*pairs: tuple[str, float]) -> list[dict]:
    return [{"word": word, "ts": at(seconds)} for word, seconds in pairs]


def counted(start: int, end: int, word: str, n: int) -> dict:
    """An output row: a window (ms after T0), its last instant in whole ms (window_time), the word's count."""
    return {"window_start": start, "window_end": end, "window_time": end - 1, "word": word, "n": n}


def closing(rows, at: float) -> None:
    """Two batches of `z`: the second runs with the watermark the first set (at - 1s)."""
    rows.batch("events", events(("z", at))).batch("events", events(("z", at + 1)))


def test_sliding_windows_count_each_record_in_every_window_it_falls_in(spark_session, rows, tmp_path):
    name = unique("sliding")
    rows.batch("events", events(("a", 1), ("a", 6), ("a", 7), ("b", 12)))
    closing(rows, 30)
    run(spark_session, windowed({"sliding": {"size": "10s", "slide": "5s"}}, name), rows, tmp_path / "cp")
    assert table(spark_session, name) == sorted_rows(
        [
            counted(-5 * SECOND, 5 * SECOND, "a", 1),
            counted(0, 10 * SECOND, "a", 3),
            counted(5 * SECOND, 15 * SECOND, "a", 2),
            counted(5 * SECOND, 15 * SECOND, "b", 1),
            counted(10 * SECOND, 20 * SECOND, "b", 1),
        ]
    )


def test_session_windows_close_after_the_gap(spark_session, rows, tmp_path):
    name = unique("session")
    rows.batch("events", events(("a", 0), ("a", 3), ("b", 1)))
    rows.batch("events", events(("a", 7), ("a", 20)))  # 7 s extends a's first session, 20 s starts another
    closing(rows, 40)
    run(spark_session, windowed({"session": "5s"}, name), rows, tmp_path / "cp")
    assert table(spark_session, name) == sorted_rows(
        [
            counted(0, 12 * SECOND, "a", 3),
            counted(20 * SECOND, 25 * SECOND, "a", 1),
            counted(1 * SECOND, 6 * SECOND, "b", 1),
        ]
    )
