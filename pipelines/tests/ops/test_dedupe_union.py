"""dedupe (by key, within the watermark) and union (by column name, of several sources)."""

from __future__ import annotations

import pytest
from rows import at, run, sorted_rows, table, timed_source, unique

pytestmark = pytest.mark.spark


def source(name: str, schema: str) -> dict:
    return timed_source(name, schema, watermark="5s")


def test_dedupe_keeps_the_first_record_of_a_key_until_the_watermark_passes_it(spark_session, rows, tmp_path):
    name = unique("dedupe")
    rows.batch(
        "clicks",
        [
            {"id": 1, "n": "first", "ts": at(0)},
            {"id": 1, "n": "again", "ts": at(1)},
            {"id": 2, "n": "first", "ts": at(2)},
        ],
    )
    rows.batch("clicks", [{"id": 1, "n": "replayed", "ts": at(3)}, {"id": 3, "n": "first", "ts": at(4)}])
    rows.batch("clicks", [{"id": 9, "n": "moves the watermark", "ts": at(100)}])
    # Spark drops a key's state at the end of the first batch run with a watermark past it (95 s here)
    rows.batch("clicks", [{"id": 1, "n": "still a duplicate", "ts": at(101)}])
    rows.batch("clicks", [{"id": 1, "n": "after expiry", "ts": at(102)}])
    run(
        spark_session,
        {
            "nodes": [
                source("clicks", "id INT, n STRING"),
                {"name": "unique", "inputs": ["clicks"], "dedupe": {"keys": ["id"]}},
                {"name": "ids", "inputs": ["unique"], "select": ["id", "n"]},
                {"name": "out", "inputs": ["ids"], "toMemory": {"table": name}},
            ]
        },
        rows,
        tmp_path / "cp",
    )
    assert table(spark_session, name) == sorted_rows(
        [
            {"id": 1, "n": "first"},
            {"id": 2, "n": "first"},
            {"id": 3, "n": "first"},
            {"id": 9, "n": "moves the watermark"},
            {"id": 1, "n": "after expiry"},
        ]
    )


@pytest.mark.parametrize("allow_missing", [True, False])
def test_union_by_column_name(spark_session, rows, tmp_path, allow_missing):
    name = unique("union")
    rows.batch("web", [{"user": "ann", "page": "/", "ts": at(0)}])
    rows.batch("app", [{"screen": "home", "user": "bob", "ts": at(1)}])
    right = "user STRING, screen STRING" if allow_missing else "screen STRING, user STRING"
    nodes = [source("web", "user STRING, page STRING"), source("app", right)]
    if not allow_missing:  # same columns in another order
        nodes[0]["fromKafka"]["schema"] = "user STRING, screen STRING, ts TIMESTAMP"
    run(
        spark_session,
        {
            "nodes": [
                *nodes,
                {"name": "all", "inputs": ["web", "app"], "union": {"allowMissingColumns": allow_missing}},
                {"name": "out", "inputs": ["all"], "toMemory": {"table": name}},
            ]
        },
        rows,
        tmp_path / "cp",
    )
    if allow_missing:
        expected = [
            {"user": "ann", "page": "/", "screen": None, "ts": 0},
            {"user": "bob", "page": None, "screen": "home", "ts": 1000},
        ]
    else:
        expected = [{"user": "ann", "screen": None, "ts": 0}, {"user": "bob", "screen": "home", "ts": 1000}]
    assert table(spark_session, name) == sorted_rows(expected)
