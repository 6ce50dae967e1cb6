"""toFiles, toConsole and toMemory, and the availableNow trigger."""

from __future__ import annotations

import pytest
from rows import at, compile_rows, plain, run, sorted_rows, table, unique, window_totals

pytestmark = pytest.mark.spark

WORDS = {"name": "words", "fromKafka": {"topic": "words", "format": "json", "schema": "word STRING, n INT"}}


def to(sink: dict) -> dict:
    return {"nodes": [WORDS, {"name": "out", "inputs": ["words"], **sink}]}


def test_to_files_writes_every_batch_partitioned(spark_session, rows, tmp_path):
    rows.batch("words", [{"word": "a", "n": 1}, {"word": "b", "n": 2}]).batch("words", [{"word": "a", "n": 3}])
    path = tmp_path / "out"
    run(
        spark_session,
        to({"toFiles": {"path": str(path), "format": "json", "partitionBy": ["word"]}}),
        rows,
        tmp_path / "cp",
    )
    assert sorted(p.name for p in path.iterdir() if p.name.startswith("word=")) == ["word=a", "word=b"]
    written = spark_session.read.json(str(path)).collect()  # through the sink's metadata log: committed files only
    assert sorted_rows([plain(r) for r in written]) == sorted_rows(
        [{"word": "a", "n": 1}, {"word": "b", "n": 2}, {"word": "a", "n": 3}]
    )


def test_to_memory_and_the_available_now_trigger(spark_session, rows, tmp_path):
    name = unique("memory")
    for n in range(3):
        rows.batch("words", [{"word": "w", "n": n}])
    [query] = run(spark_session, to({"toMemory": {"table": name}}), rows, tmp_path / "cp")
    # availableNow: one micro-batch per file (maxFilesPerTrigger), then the query ends by itself
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [1, 1, 1]
    assert table(spark_session, name) == [{"word": "w", "n": 0}, {"word": "w", "n": 1}, {"word": "w", "n": 2}]


def test_to_console_prints_each_batch(spark_session, rows, tmp_path):
    rows.batch("words", [{"word": "a", "n": 1}, {"word": "b", "n": 2}, {"word": "c", "n": 3}])
    [query] = run(spark_session, to({"toConsole": {"numRows": 2, "truncate": True}}), rows, tmp_path / "cp")
    [progress] = [p for p in query.recentProgress if p["numInputRows"]]
    assert "Console" in progress["sink"]["description"]
    assert progress["sink"]["numOutputRows"] == 3


def test_to_console_after_top_n_prints_the_top_rows(spark_session, rows, tmp_path, capsys):
    """After topN the console sink runs per batch in Python (foreachBatch): its table is this process's."""
    rows.batch("scores", [{"player": p, "points": n, "ts": at(0)} for p, n in (("ann", 5), ("bob", 9), ("cy", 7))])
    rows.batch("scores", [{"player": "z", "points": 0, "ts": at(60)}])
    rows.batch("scores", [{"player": "z", "points": 0, "ts": at(61)}])
    capsys.readouterr()
    run(
        spark_session,
        {
            "nodes": [
                *window_totals(),
                {"name": "top", "inputs": ["totals"], "topN": {"limit": 2, "orderBy": ["points DESC"]}},
                {"name": "ranked", "inputs": ["top"], "select": ["player", "points"]},
                {"name": "out", "inputs": ["ranked"], "toConsole": {"numRows": 5}},
            ]
        },
        rows,
        tmp_path / "cp",
    )
    printed = capsys.readouterr().out
    assert "|bob   |9     |\n|cy    |7     |\n+------+------+" in printed
    assert "ann" not in printed


TIMED = {
    "name": "words",
    "fromKafka": {
        "topic": "words",
        "format": "json",
        "schema": "word STRING, n INT, ts TIMESTAMP",
        "eventTime": "ts",
        "watermark": "5s",
    },
}
COUNTS = {"name": "counts", "inputs": ["words"], "aggregate": {"groupBy": ["word"], "aggregations": {"n": "count(*)"}}}
WINDOWED = {
    "name": "counts",
    "inputs": ["words"],
    "aggregate": {"groupBy": ["word"], "window": {"tumbling": "10s"}, "aggregations": {"n": "count(*)"}},
}


@pytest.mark.parametrize(
    ("steps", "sink", "grouped"),
    [
        ([COUNTS], {}, True),
        ([COUNTS], {"outputMode": "complete"}, False),  # every group in every batch
        ([WINDOWED], {}, True),
        ([COUNTS, {"name": "big", "inputs": ["counts"], "filter": "n > 1"}], {}, True),
        ([COUNTS, {"name": "big", "inputs": ["counts"], "explode": {"column": "c", "from": "array(n, n)"}}], {}, False),
        ([{"name": "big", "inputs": ["words"], "filter": "n > 1"}], {}, False),
    ],
)
def test_the_outputs_that_are_an_aggregations_groups(spark_session, rows, steps, sink, grouped):
    """What an exactly-once Kafka sink with writers auto writes from the driver: rows bounded by the groups a
    batch touched (one row may not become many on the way, and complete mode writes them all every time)."""
    last = steps[-1]["name"]
    pipeline = {"nodes": [TIMED, *steps, {"name": "out", "inputs": [last], "toMemory": {"table": unique("g"), **sink}}]}
    _, compiled = compile_rows(spark_session, pipeline, rows)
    [plan] = [q for q in compiled.queries if q.name == "out"]
    assert plan.grouped is grouped
