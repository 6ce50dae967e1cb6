"""What Spark would refuse when a query starts, found without starting it.

Spark runs its unsupported-operation check (output mode against the operators, and their order: a join
of two streams in update mode, an aggregation after an aggregation, ...) only as a query starts. Here the
same check, `UnsupportedOperationChecker.checkForStreaming(plan, outputMode)`, runs on each compiled
query's analysed plan with the sink's output mode, and what it refuses is a Problem at the query's sink
node. `sluice validate` (with Spark) and the runner, before it starts any query, both call
`streaming_problems`, so both say the same thing.
"""

from __future__ import annotations

import re

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructField, StructType

from sluice.api.pipeline import Node, PipelineSpec
from sluice.api.validation import PipelineInvalid, Problem, join_path

from .compiler import CompiledPipeline, compile_pipeline

OUTPUT_MODES = {"append": "Append", "update": "Update", "complete": "Complete"}
_HEADERS = ArrayType(StructType([StructField("key", StringType()), StructField("value", BinaryType())]))


def java_message(exc: Exception) -> str:
    """The first line of an error's message (a JVM exception's own message when py4j wraps one)."""
    java = getattr(exc, "java_exception", None)  # py4j wraps JVM exceptions
    message = str(java.getMessage() if java is not None else exc)
    return next((line.strip() for line in message.splitlines() if line.strip()), message)


def failure_message(exc: Exception) -> str:
    """What to tell of a failure: java_message, or the exception's class when it has no message (never py4j's
    `An error occurred while calling o2909.offsetsForTimes`, which names an object id and no cause)."""
    java = getattr(exc, "java_exception", None)
    message = java_message(exc) if java is None or java.getMessage() is not None else ""
    return message or str(java.getClass().getName() if java is not None else type(exc).__name__)


def sink_path(spec: PipelineSpec, prefix: str, query: str) -> str:
    """The sink node of a query (named after it), or the dead letter sink (`<source>-dead-letters`)."""
    for index, node in enumerate(spec.nodes):
        if node.name == query:
            return join_path(prefix, "nodes", index)
    return join_path(prefix, "deadLetter")


def streaming_problems(
    spark: SparkSession, compiled: CompiledPipeline, spec: PipelineSpec, prefix: str
) -> list[Problem]:
    """Spark's unsupported-operation check on every query of `compiled`, nothing started: one Problem (at
    the query's sink node, Spark's message) per query Spark would refuse to start."""
    jvm = spark._jvm
    assert jvm is not None
    if str(spark.conf.get("spark.sql.streaming.unsupportedOperationCheck", "true")).lower() != "true":
        return []  # Spark would not check either
    checker = jvm.org.apache.spark.sql.catalyst.analysis.UnsupportedOperationChecker
    modes = jvm.org.apache.spark.sql.streaming.OutputMode
    problems = []
    for plan in compiled.queries:
        mode = getattr(modes, OUTPUT_MODES[plan.output_mode.lower()])()
        try:
            checker.checkForStreaming(plan.df._jdf.queryExecution().analyzed(), mode)
        except AnalysisException as exc:
            problems.append(Problem(sink_path(spec, prefix, plan.name), java_message(exc)))
    return problems


def stand_in_frames(spark: SparkSession):
    """The compiler's source_frames seam for checking without Kafka: a stream with the Kafka source's
    columns (and headers), read from nowhere (nothing is started)."""

    def frame(node: Node) -> DataFrame:
        raw = spark.readStream.format("rate").load()
        return raw.select(
            F.lit(None).cast("binary").alias("key"),
            F.lit(None).cast("binary").alias("value"),
            F.lit(node.name).alias("topic"),
            F.lit(0).alias("partition"),
            F.col("value").alias("offset"),
            "timestamp",
            F.lit(None).cast(_HEADERS).alias("headers"),
        )

    return frame


# What these operations read (a lookup's files, a python step's module) is where the app runs, maybe not here.
ENVIRONMENT_OPS = ("lookup", "python")


def plan_problems(spark: SparkSession, spec: PipelineSpec, prefix: str) -> list[Problem]:
    """A valid spec compiled on stand-in sources, then checked as the runner checks it before starting.

    The compiler's own refusals are reported too, except at a node that reads from its environment: there
    this machine cannot judge, and the plan is not checked (the runner checks it at start)."""
    try:
        compiled = compile_pipeline(spark, spec, kafka=None, prefix=prefix, source_frames=stand_in_frames(spark))
    except PipelineInvalid as exc:
        local = {join_path(prefix, "nodes", i) for i, n in enumerate(spec.nodes) if n.operation in ENVIRONMENT_OPS}
        if any(_at_node(problem.path, local) for problem in exc.problems):
            return []
        return exc.problems
    return streaming_problems(spark, compiled, spec, prefix)


def _at_node(path: str, nodes: set[str]) -> bool:
    return any(path == node or path.startswith((f"{node}.", f"{node}[")) for node in nodes)


_RAISED = re.compile(r"^(?:\w+\.)*(\w+(?:Error|Exception)): (.+)$", re.MULTILINE)


def error_summary(error: str) -> str:
    """A query's error in one line: its first, or for an error raised in a Python sink (Spark wraps its
    traceback: "An exception was raised by the Python Proxy..."), the exception the traceback ends with."""
    raised = _RAISED.findall(error) if "Traceback (most recent call last)" in error else []
    return ": ".join(raised[-1]) if raised else error.split("\n")[0]


def spark_sql_parser(spark: SparkSession):
    """A validation SqlParser backed by Spark's own expression parser (F.expr parses lazily in Spark 4)."""
    parser = spark._jsparkSession.sessionState().sqlParser()

    def parse(expression: str) -> str | None:
        try:
            parser.parseExpression(expression)
        except Exception as exc:
            return java_message(exc)
        return None

    return parse


def spark_ddl_parser(spark: SparkSession):
    jvm = spark._jvm
    assert jvm is not None
    struct_type = jvm.org.apache.spark.sql.types.StructType

    def parse(ddl: str) -> list[str] | str:
        try:
            return list(struct_type.fromDDL(ddl).fieldNames())
        except Exception as exc:
            return java_message(exc)

    return parse
