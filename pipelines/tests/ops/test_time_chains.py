"""A windowed aggregation's output keeps an event time, its window_time (the window's last instant): a further
windowed aggregation, or a stream-stream join, runs over it (issue #14 §4). References are computed here
from the input rows."""

from __future__ import annotations

import random
from collections import defaultdict
from statistics import fmean

import pytest
from rows import at, run, sorted_rows, table, timed_source, unique

pytestmark = pytest.mark.spark

SECOND = 1000


def in_batches(rows, name: str, records: list[dict], seconds: list[float], span: float) -> None:
    """`records` (event time `seconds`: whole quarters, exact in ms) as micro-batches of `span` seconds of event
    time, in time order."""
    batches: dict[int, list[dict]] = defaultdict(list)
    for record, second in sorted(zip(records, seconds, strict=True), key=lambda pair: pair[1]):
        batches[int(second // span)].append(record)
    for index in sorted(batches):
        rows.batch(name, batches[index])


def closing(rows, name: str, record: dict, start: float) -> None:
    """Batches far ahead in time (their own windows never close): every earlier window closes."""
    for step in range(4):
        rows.batch(name, [{**record, "ts": at(start + step)}])


def test_per_minute_average_of_per_second_maxima(spark_session, rows, tmp_path):
    rng = random.Random(14)
    readings = [
        (sensor, second + rng.choice((0, 0.25, 0.5, 0.75)), rng.randint(0, 100))
        for second in range(120)
        for sensor in ("a", "b")
        for _ in range(rng.randint(0, 3))
    ]
    seconds = [t for _, t, _ in readings]
    in_batches(rows, "temps", [{"sensor": s, "t": v, "ts": at(t)} for s, t, v in readings], seconds, 30)
    closing(rows, "temps", {"sensor": "z", "t": 0}, 300)
    name = unique("chained")
    run(
        spark_session,
        {
            "nodes": [
                timed_source("temps", "sensor STRING, t INT"),
                {
                    "name": "per-second",
                    "inputs": ["temps"],
                    "aggregate": {
                        "groupBy": ["sensor"],
                        "window": {"tumbling": "1s"},
                        "aggregations": {"hi": "max(t)"},
                    },
                },
                {
                    "name": "per-minute",
                    "inputs": ["per-second"],
                    "aggregate": {
                        "groupBy": ["sensor"],
                        "window": {"tumbling": "1m"},
                        "aggregations": {"avg_hi": "avg(hi)", "seconds": "count(*)"},
                    },
                },
                {"name": "out", "inputs": ["per-minute"], "toMemory": {"table": name}},
            ]
        },
        rows,
        tmp_path / "cp",
    )
    maxima: dict[tuple[str, int], int] = {}
    for sensor, t, value in readings:
        key = (sensor, int(t))
        maxima[key] = max(value, maxima.get(key, value))
    per_minute: dict[tuple[str, int], list[int]] = defaultdict(list)
    for (sensor, second), value in maxima.items():
        per_minute[(sensor, second // 60 * 60)].append(value)
    expected = [
        {
            "window_start": minute * SECOND,
            "window_end": (minute + 60) * SECOND,
            "window_time": (minute + 60) * SECOND - 1,  # end - 1 µs, in whole ms
            "sensor": sensor,
            "avg_hi": fmean(values),
            "seconds": len(values),
        }
        for (sensor, minute), values in per_minute.items()
    ]
    assert len(expected) == 4
    assert table(spark_session, name) == sorted_rows(expected)


def test_a_join_of_each_event_with_the_count_of_its_window(spark_session, rows, tmp_path):
    rng = random.Random(4)
    events = [(rng.choice("abc"), rng.randrange(0, 160) / 4) for _ in range(60)]
    in_batches(rows, "words", [{"word": w, "ts": at(t)} for w, t in events], [t for _, t in events], 10)
    closing(rows, "words", {"word": "z"}, 100)
    name = unique("counted")
    run(
        spark_session,
        {
            "nodes": [
                timed_source("words", "word STRING"),
                {
                    "name": "counts",
                    "inputs": ["words"],
                    "aggregate": {
                        "groupBy": ["word"],
                        "window": {"tumbling": "10s"},
                        "aggregations": {"n": "count(*)"},
                    },
                },
                {
                    "name": "counted",
                    "inputs": ["words", "counts"],
                    "join": {
                        "condition": "words.word = counts.word AND counts.window_start <= words.ts",
                        "within": "10s",
                        "select": ["words.word AS word", "words.ts AS ts", "counts.n AS n"],
                    },
                },
                {"name": "out", "inputs": ["counted"], "toMemory": {"table": name}},
            ]
        },
        rows,
        tmp_path / "cp",
    )
    window_counts: dict[tuple[str, int], int] = defaultdict(int)
    for word, t in events:
        window_counts[(word, int(t // 10))] += 1
    expected = [{"word": word, "ts": round(t * SECOND), "n": window_counts[(word, int(t // 10))]} for word, t in events]
    assert table(spark_session, name) == sorted_rows(expected)


def test_window_counts_joined_to_another_stream_within_a_bound(spark_session, rows, tmp_path):
    """Each 10 s count per word with the alerts of that word in the 5 s after its window."""
    rng = random.Random(9)
    views = [(rng.choice("ab"), rng.randrange(0, 120) / 4) for _ in range(40)]
    alerts = [(rng.choice("ab"), rng.randrange(0, 160) / 4) for _ in range(12)]
    in_batches(rows, "views", [{"word": w, "ts": at(t)} for w, t in views], [t for _, t in views], 10)
    in_batches(rows, "alerts", [{"word": w, "ts": at(t)} for w, t in alerts], [t for _, t in alerts], 10)
    closing(rows, "views", {"word": "z"}, 100)
    closing(rows, "alerts", {"word": "z"}, 100)
    name = unique("alerted")
    run(
        spark_session,
        {
            "nodes": [
                timed_source("views", "word STRING"),
                timed_source("alerts", "word STRING"),
                {
                    "name": "counts",
                    "inputs": ["views"],
                    "aggregate": {
                        "groupBy": ["word"],
                        "window": {"tumbling": "10s"},
                        "aggregations": {"n": "count(*)"},
                    },
                },
                {
                    "name": "alerted",
                    "inputs": ["counts", "alerts"],
                    "join": {
                        "condition": "counts.word = alerts.word",
                        "within": "5s",
                        "select": [
                            "counts.word AS word",
                            "counts.window_start AS window_start",
                            "counts.n AS n",
                            "alerts.ts AS alert",
                        ],
                    },
                },
                {"name": "out", "inputs": ["alerted"], "toMemory": {"table": name}},
            ]
        },
        rows,
        tmp_path / "cp",
    )
    counts: dict[tuple[str, int], int] = defaultdict(int)
    for word, t in views:
        counts[(word, int(t // 10) * 10)] += 1
    expected = [
        {"word": word, "window_start": start * SECOND, "n": n, "alert": round(t * SECOND)}
        for (word, start), n in counts.items()
        for alert_word, t in alerts
        # the alert's time lies within 5 s after the window's last instant (end - 1 µs)
        if alert_word == word and start + 10 - 1e-6 <= t <= start + 15 - 1e-6
    ]
    assert expected  # the data has matches
    assert table(spark_session, name) == sorted_rows(expected)
