"""The compiler's refusals: each names the node's field, before any query starts."""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import compile_rows

from sluice.api.validation import PipelineInvalid

pytestmark = pytest.mark.spark

TEXT = {"name": "lines", "fromKafka": {"topic": "lines"}}
TIMED = {
    "name": "events",
    "fromKafka": {
        "topic": "events",
        "format": "json",
        "schema": "k STRING, ts TIMESTAMP",
        "eventTime": "ts",
        "watermark": "5s",
    },
}
UNTIMED = {"name": "plain", "fromKafka": {"topic": "plain", "format": "json", "schema": "k STRING, ts TIMESTAMP"}}
WINDOWED = {
    "name": "counts",
    "inputs": ["events"],
    "aggregate": {"groupBy": ["k"], "window": {"tumbling": "10s"}, "aggregations": {"n": "count(*)"}},
}
TOP = {"name": "top", "inputs": ["counts"], "topN": {"limit": 1, "orderBy": ["n DESC"]}}


def memory(name: str, upstream: str) -> dict:
    return {"name": name, "inputs": [upstream], "toMemory": {"table": f"t_{name.replace('-', '_')}"}}


def refusal(spark, rows, *nodes: dict) -> list[str]:
    with pytest.raises(PipelineInvalid) as refused:
        compile_rows(spark, {"nodes": list(nodes)}, rows)
    return [str(p) for p in refused.value.problems]


CASES = {
    "aggregate after topN": (
        [
            TIMED,
            WINDOWED,
            TOP,
            {"name": "again", "inputs": ["top"], "aggregate": {"aggregations": {"n": "count(*)"}}},
            memory("out", "again"),
        ],
        "nodes[3].aggregate: an aggregation cannot follow topN",
    ),
    "window without event time": (
        [
            UNTIMED,
            {
                "name": "w",
                "inputs": ["plain"],
                "aggregate": {"window": {"tumbling": "5s"}, "aggregations": {"n": "count(*)"}},
            },
            memory("out", "w"),
        ],
        "nodes[1].aggregate.window: needs an event-time column: set eventTime on the source or window.timeColumn",
    ),
    "running total over a windowed aggregation": (
        [
            TIMED,
            WINDOWED,
            {"name": "total", "inputs": ["counts"], "aggregate": {"groupBy": ["k"], "aggregations": {"n": "sum(n)"}}},
            memory("out", "total"),
        ],
        "nodes[2].aggregate.window: an aggregation after a windowed aggregation needs a window (over its event time "
        "window_time) or window_time in groupBy",
    ),
    "window over an aggregation without a watermark": (
        [
            UNTIMED,
            {
                **WINDOWED,
                "inputs": ["plain"],
                "aggregate": {**WINDOWED["aggregate"], "window": {"tumbling": "10s", "timeColumn": "ts"}},
            },
            {
                "name": "w2",
                "inputs": ["counts"],
                "aggregate": {"window": {"tumbling": "1m"}, "aggregations": {"n": "sum(n)"}},
            },
            memory("out", "w2"),
        ],
        "nodes[2].aggregate: cannot aggregate the output of an aggregation without a watermarked window (it runs in "
        "update mode; Spark chains aggregations in append mode only): window the first one over an event time with "
        "a watermark",
    ),
    "join without watermarks": (
        [
            TIMED,
            UNTIMED,
            {"name": "j", "inputs": ["events", "plain"], "join": {"condition": "events.k = plain.k", "within": "1m"}},
            memory("out", "j"),
        ],
        "nodes[2].join.within: input 'plain' needs an event time with a watermark (set eventTime and watermark on "
        "its source)",
    ),
    "dedupe without watermark": (
        [UNTIMED, {"name": "d", "inputs": ["plain"], "dedupe": {"keys": ["k"]}}, memory("out", "d")],
        "nodes[1].dedupe: needs a watermarked input (set eventTime and watermark on the source)",
    ),
    "union after topN": (
        [TIMED, WINDOWED, TOP, {"name": "u", "inputs": ["top", "counts"], "union": {}}, memory("out", "u")],
        "nodes[3].union: inputs after topN cannot be unioned",
    ),
    "topN without a windowed aggregation": (
        [TEXT, {"name": "t", "inputs": ["lines"], "topN": {"limit": 1, "orderBy": ["value"]}}, memory("out", "t")],
        "nodes[1].topN: needs a windowed aggregation with a watermark upstream (each window's rows are final only "
        "then)",
    ),
    "topN over an unknown column": (
        [
            TIMED,
            WINDOWED,
            {**TOP, "topN": {"limit": 1, "orderBy": ["n"], "partitionBy": ["nope"]}},
            memory("out", "top"),
        ],
        "nodes[2].topN.partitionBy: unknown column(s) nope",
    ),
    "files in update mode": (
        [
            UNTIMED,
            {"name": "n", "inputs": ["plain"], "aggregate": {"groupBy": ["k"], "aggregations": {"n": "count(*)"}}},
            {"name": "out", "inputs": ["n"], "toFiles": {"path": "/tmp/never"}},
        ],
        "nodes[2].toFiles.outputMode: file sinks take append mode only: aggregate over a window with a watermark so "
        "each window is written once",
    ),
    "python function that cannot be loaded": (
        [TEXT, {"name": "p", "inputs": ["lines"], "python": {"function": "transforms:missing"}}, memory("out", "p")],
        "nodes[1].python.function: cannot load transforms:missing: module 'transforms' has no attribute 'missing'",
    ),
    "python function that returns no DataFrame": (
        [
            TEXT,
            {"name": "p", "inputs": ["lines"], "python": {"function": "transforms:not_a_frame"}},
            memory("out", "p"),
        ],
        "nodes[1].python: transforms:not_a_frame returned int, not a DataFrame",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_refused_with_the_field(spark_session, rows, case):
    nodes, problem = CASES[case]
    assert refusal(spark_session, rows, *nodes) == [problem]


def test_an_unknown_column_names_the_node(spark_session, rows):
    [problem] = refusal(
        spark_session, rows, TEXT, {"name": "f", "inputs": ["lines"], "filter": "wrod != ''"}, memory("out", "f")
    )
    assert problem.startswith(
        "nodes[1].filter: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function "
        "parameter with name `wrod` cannot be resolved."
    )


def test_a_lookup_table_that_cannot_be_read_or_lacks_the_keys(spark_session, rows, tmp_path: Path):
    table = tmp_path / "firms.csv"
    table.write_text("firm,name\n1,acme\n")
    lookup = {"name": "l", "inputs": ["events"], "lookup": {"path": str(table), "keys": ["k"]}}
    assert refusal(spark_session, rows, TIMED, lookup, memory("out", "l")) == [
        f"nodes[1].lookup.keys: table {table} has no column(s) k (it has firm, name)"
    ]
    missing = {**lookup, "lookup": {"path": str(tmp_path / "none.csv"), "keys": ["k"]}}
    [problem] = refusal(spark_session, rows, TIMED, missing, memory("out", "l"))
    assert problem.startswith(f"nodes[1].lookup.path: cannot read {tmp_path / 'none.csv'}: ")
