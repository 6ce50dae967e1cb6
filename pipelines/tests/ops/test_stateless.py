"""select, filter, withColumns, explode and python, on rows batches (exact output)."""

from __future__ import annotations

import pytest
from rows import run, sorted_rows, table, unique

pytestmark = pytest.mark.spark

SOURCE = {
    "name": "orders",
    "fromKafka": {"topic": "orders", "format": "json", "schema": "id INT, item STRING, price DOUBLE, qty INT"},
}
ORDERS = [
    {"id": 1, "item": "tea", "price": 2.5, "qty": 2},
    {"id": 2, "item": "cake", "price": 4.0, "qty": 1},
    {"id": 3, "item": "tea", "price": 2.5, "qty": 0},
]


def pipeline(*steps: dict, table_name: str) -> dict:
    nodes = [SOURCE]
    for i, step in enumerate(steps):
        nodes.append({"name": f"step-{i}", "inputs": [nodes[-1]["name"]], **step})
    nodes.append({"name": "out", "inputs": [nodes[-1]["name"]], "toMemory": {"table": table_name}})
    return {"nodes": nodes}


def test_select_filter_and_with_columns(spark_session, rows, tmp_path):
    name = unique("stateless")
    rows.batch("orders", ORDERS[:2]).batch("orders", ORDERS[2:])
    run(
        spark_session,
        pipeline(
            {"filter": "qty > 0"},
            {"withColumns": {"revenue": "price * qty", "item": "upper(item)"}},
            {"select": ["id", "item", "revenue", "revenue > 4 AS big"]},
            table_name=name,
        ),
        rows,
        tmp_path / "checkpoints",
    )
    assert table(spark_session, name) == sorted_rows(
        [{"id": 1, "item": "TEA", "revenue": 5.0, "big": True}, {"id": 2, "item": "CAKE", "revenue": 4.0, "big": False}]
    )


def test_explode_outer_keeps_rows_without_elements(spark_session, rows, tmp_path):
    name = unique("explode")
    rows.batch("orders", ORDERS)
    explode = {"column": "unit", "from": "IF(qty > 0, sequence(1, qty), array())", "drop": ["price"], "outer": True}
    run(
        spark_session,
        pipeline({"explode": explode}, {"select": ["id", "unit"]}, table_name=name),
        rows,
        tmp_path / "checkpoints",
    )
    assert table(spark_session, name) == sorted_rows(
        [{"id": 1, "unit": 1}, {"id": 1, "unit": 2}, {"id": 2, "unit": 1}, {"id": 3, "unit": None}]
    )


def test_python_calls_the_function_with_its_args(spark_session, rows, tmp_path):
    name = unique("python")
    rows.batch("orders", ORDERS[:1])
    run(
        spark_session,
        pipeline(
            {"python": {"function": "transforms:labelled", "args": {"label": "vip"}}},
            {"select": ["id", "label"]},
            table_name=name,
        ),
        rows,
        tmp_path / "checkpoints",
    )
    assert table(spark_session, name) == [{"id": 1, "label": "vip"}]
