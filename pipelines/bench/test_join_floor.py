"""Benchmark: the per-batch floor of a stream-stream join, pipelines/examples/latency-correlation.yaml (requests
joined with their responses within 1 s, then averaged per firm over 1-minute windows), with the join's state in
one RocksDB store per partition (format 3, sluice's default) against four (format 2, Spark's default).

A thread writes SLUICE_BENCH_JOIN_RATE requests/s (default 100, JSON id/firm/ts, 20 firms) and each one's
response 50-450 ms later to fresh topics of 4 partitions, for SLUICE_BENCH_JOIN_SECONDS (default 60), while
the example runs in this process (sluice's runtime, the test session's 2 cores and 2 shuffle partitions, its
exactly-once Kafka sinks). The two formats alternate, SLUICE_BENCH_JOIN_ROUNDS times each (default 3). Per run,
over the join query's batches after the first 5 (a cold start): the median batch time and its parts (Spark's
durationMs) and each state operator's median commit time. The query must read every record written, else the
benchmark fails. Printed, and written to .sluice/bench/join-floor.json.
"""

from __future__ import annotations

import heapq
import json
import os
import random
import statistics
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from bench_report import write_json
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from sluice.api.contract import RunnerConfig
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.pipelines.queries import JOIN_STATE_FORMAT
from sluice.testbed.common import REPO_ROOT, wait_for

pytestmark = pytest.mark.bench

RATE = float(os.environ.get("SLUICE_BENCH_JOIN_RATE", "100"))
SECONDS = float(os.environ.get("SLUICE_BENCH_JOIN_SECONDS", "60"))
ROUNDS = int(os.environ.get("SLUICE_BENCH_JOIN_ROUNDS", "3"))
COLD_BATCHES = 5
EXAMPLE = REPO_ROOT / "pipelines" / "examples" / "latency-correlation.yaml"
OUTPUT = REPO_ROOT / ".sluice" / "bench" / "join-floor.json"
FORMATS = {"one store (3)": None, "four stores (2)": "2"}  # None: sluice's default
PARTS = ("triggerExecution", "queryPlanning", "addBatch", "walCommit", "commitOffsets")


class RequestsAndResponses:
    """`rate` requests/s and each one's response 50-450 ms later, from a thread; counts what it wrote."""

    def __init__(self, bootstrap: str, requests: str, responses: str, rate: float) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topics, self.rate = (requests, responses), rate
        self.written = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="requests-and-responses", daemon=True)

    def start(self) -> RequestsAndResponses:
        self._thread.start()
        return self

    def _send(self, topic: str, record: dict[str, str]) -> None:
        self.producer.produce(topic, json.dumps(record).encode(), key=record["id"].encode())
        self.written += 1

    def _run(self) -> None:
        rng, due, owed, last, sent = random.Random(7), [], 0.0, time.monotonic(), 0
        while not self._stop.wait(0.05):
            now = time.monotonic()
            owed, last = owed + self.rate * (now - last), now
            while owed >= 1:
                owed, sent = owed - 1, sent + 1
                self._send(
                    self.topics[0], {"id": f"r{sent}", "firm": f"firm{rng.randrange(20)}", "ts": iso(time.time())}
                )
                heapq.heappush(due, (now + rng.uniform(0.05, 0.45), f"r{sent}"))
            while due and due[0][0] <= now:
                at, request = heapq.heappop(due)
                self._send(self.topics[1], {"id": request, "ts": iso(time.time() - (now - at))})
            self.producer.poll(0)
        for _, request in due:  # every request answered: the query must read them all
            self._send(self.topics[1], {"id": request, "ts": iso(time.time())})
        self.producer.flush(30)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(60)
        return self.written


def iso(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def pipeline(topics: dict[str, str]) -> PipelineSpec:
    """The example's pipeline on fresh topics (its topic names replaced)."""
    text = json.dumps(yaml.safe_load(EXAMPLE.read_text())["spec"]["pipeline"])
    for name, topic in topics.items():
        text = text.replace(f'"{name}"', f'"{topic}"')
    return PipelineSpec.model_validate_json(text)


def run_once(spark, bootstrap: str, new_topic, join_format: str | None, tmp_path) -> dict[str, Any]:
    topics = {
        "latency-requests": new_topic(4),
        "latency-responses": new_topic(4),
        "latency-by-firm": new_topic(4),
        "latency-dead-letters": new_topic(1),
    }
    if join_format:
        spark.conf.set(JOIN_STATE_FORMAT, join_format)
    config = RunnerConfig(
        app="join-floor",
        revision="bench",
        kafkaBootstrap=bootstrap,
        pipeline=pipeline(topics),
        checkpointRoot=str(tmp_path / f"checkpoints-{time.time_ns()}"),
        controlPort=0,
    )
    run = PipelineRun(spark, config).start()
    try:
        load = RequestsAndResponses(bootstrap, topics["latency-requests"], topics["latency-responses"], RATE).start()
        time.sleep(SECONDS)
        written = load.stop()
        query = next(q for q in run.queries if q.name == "out")
        wait_for(
            lambda: sum(p["numInputRows"] for p in query.recentProgress) >= written,
            timeout=120,
            what="the join query to read every request and response",
        )
        progress = list(query.recentProgress)
        recorded_format = (Path(config.checkpoint("out")) / "offsets" / "0").read_text().splitlines()[1]
    finally:
        run.stop()
        if join_format:
            spark.conf.unset(JOIN_STATE_FORMAT)
    assert len(progress) < 100, "Spark keeps the last 100 progress reports: shorten the run or lower the rate"
    read = sum(p["numInputRows"] for p in progress)
    assert read == written, f"the join query read {read} records of the {written} written"
    assert json.loads(recorded_format)["conf"][JOIN_STATE_FORMAT] == (join_format or "3")
    batches = [p for p in progress if p["numInputRows"] > 0][COLD_BATCHES:]
    assert batches, f"no batch after the first {COLD_BATCHES}"
    commits: dict[str, list[int]] = {}
    for p in batches:
        for operator in p["stateOperators"]:
            commits.setdefault(operator["operatorName"], []).append(operator["commitTimeMs"])
    return {
        "written": written,
        "batches": len(batches),
        "records_per_batch_median": statistics.median(p["numInputRows"] for p in batches),
        "ms_median": {part: statistics.median(p["durationMs"].get(part, 0) for p in batches) for part in PARTS},
        "commit_ms_median": {name: statistics.median(values) for name, values in commits.items()},
    }


def test_join_floor(spark_session, kafka_bootstrap, new_topic, tmp_path) -> None:
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in FORMATS}
    for _ in range(ROUNDS):
        for name, join_format in FORMATS.items():
            runs[name].append(run_once(spark_session, kafka_bootstrap, new_topic, join_format, tmp_path))
    table = Table(title=f"latency-correlation's join query: {RATE:g} requests/s and their responses, medians per run")
    for column in ("join state", "records/batch", *PARTS, "join commit", "aggregation commit"):
        table.add_column(column)
    for name, results in runs.items():
        table.add_row(
            name,
            " / ".join(f"{r['records_per_batch_median']:g}" for r in results),
            *(" / ".join(f"{r['ms_median'][part]:g}" for r in results) for part in PARTS),
            " / ".join(f"{r['commit_ms_median'].get('symmetricHashJoin', 0):g}" for r in results),
            " / ".join(f"{r['commit_ms_median'].get('stateStoreSave', 0):g}" for r in results),
        )
    Console().print(table)
    write_json(OUTPUT, {"rate": RATE, "seconds": SECONDS, "rounds": ROUNDS, "runs": runs})
    Console().print(f"written to {OUTPUT}")
