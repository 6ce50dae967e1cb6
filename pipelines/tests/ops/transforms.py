"""Functions the `python` operation's tests load by name ("transforms:labelled")."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def labelled(df: DataFrame, label: str, column: str = "label") -> DataFrame:
    return df.withColumn(column, F.lit(label))


def not_a_frame(df: DataFrame) -> int:
    return 42
