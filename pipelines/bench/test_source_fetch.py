"""Benchmark: a Kafka source's micro-batch read time at a live topic's end, with sluice's fetch.max.wait.ms
(10 ms) against the Java client's default (500 ms).

A paced producer (bench_workload's) writes SLUICE_BENCH_FETCH_RATE records/s (default 20) round-robin to a fresh
topic of 4 partitions while a query reads it with the source options sluice compiles (`kafka_source_options`), into
Spark's noop sink, trigger 1 s, for SLUICE_BENCH_FETCH_SECONDS (default 40). The two settings alternate
(sluice, Java default, sluice, Java default), each on a fresh topic. Per run: the median addBatch and batch
time of the batches that read records (the first 5 left out: a cold start). Every record written must have
been read: a short count fails the benchmark. Printed, and written to .sluice/bench/source-fetch.json.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

import pytest
from bench_report import write_json
from bench_workload import PacedProducer
from rich.console import Console
from rich.table import Table

from sluice.api.kafka_clients import KafkaClient
from sluice.api.pipeline import SOURCE_FETCH_MAX_WAIT_MS, FromKafka
from sluice.pipelines.kafka_source import kafka_source_options
from sluice.testbed.common import REPO_ROOT

pytestmark = pytest.mark.bench

RATE = float(os.environ.get("SLUICE_BENCH_FETCH_RATE", "20"))
SECONDS = float(os.environ.get("SLUICE_BENCH_FETCH_SECONDS", "40"))
PARTITIONS = 4
COLD_BATCHES = 5
OUTPUT = REPO_ROOT / ".sluice" / "bench" / "source-fetch.json"
SETTINGS = {"sluice": {}, "java-default": {"kafka.fetch.max.wait.ms": "500"}}


def run_once(spark, bootstrap: str, topic: str, options: dict[str, str]) -> dict[str, Any]:
    source = FromKafka(topic=topic, startingOffsets="earliest", options=options)
    frame = (
        spark.readStream.format("kafka")
        .options(**kafka_source_options(source, KafkaClient(bootstrap), "earliest"))
        .load()
    )
    query = frame.writeStream.format("noop").trigger(processingTime="1 second").start()
    try:
        sent = PacedProducer(bootstrap, topic, PARTITIONS, RATE, SECONDS).start().result(SECONDS + 60).records
        deadline = time.monotonic() + 60
        while sum(p["numInputRows"] for p in query.recentProgress) < sent and time.monotonic() < deadline:
            time.sleep(0.5)
        progress = list(query.recentProgress)
    finally:
        query.stop()
    read = sum(p["numInputRows"] for p in progress)
    assert read == sent, f"{topic}: read {read} records of the {sent} written"
    batches = [p for p in progress if p["numInputRows"] > 0][COLD_BATCHES:]
    assert batches, f"{topic}: no batch after the first {COLD_BATCHES}"
    return {
        "records": sent,
        "batches": len(batches),
        "add_batch_ms_median": statistics.median(p["durationMs"]["addBatch"] for p in batches),
        "batch_ms_median": statistics.median(p["durationMs"]["triggerExecution"] for p in batches),
    }


def test_source_fetch_wait(spark_session, kafka_bootstrap, new_topic) -> None:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    for _ in range(2):
        for name, options in SETTINGS.items():
            runs[name].append(run_once(spark_session, kafka_bootstrap, new_topic(PARTITIONS), options))
    table = Table(title=f"Kafka source at a live topic's end: {RATE:g} records/s, {PARTITIONS} partitions, trigger 1 s")
    for column in ("setting", "fetch.max.wait.ms", "addBatch median (ms)", "batch median (ms)", "batches"):
        table.add_column(column)
    for name, results in runs.items():
        wait = SETTINGS[name].get("kafka.fetch.max.wait.ms", str(SOURCE_FETCH_MAX_WAIT_MS))
        table.add_row(
            name,
            wait,
            " / ".join(f"{r['add_batch_ms_median']:g}" for r in results),
            " / ".join(f"{r['batch_ms_median']:g}" for r in results),
            " / ".join(str(r["batches"]) for r in results),
        )
    Console().print(table)
    write_json(OUTPUT, {"rate": RATE, "seconds": SECONDS, "partitions": PARTITIONS, "runs": runs})
    Console().print(f"written to {OUTPUT}")
