"""Benchmark: toKafka.delivery exactlyOnce vs atLeastOnce, on the frequency count and the windowed word count.

The jobs. The example pipelines as they are, run by PipelineRun, with every Kafka sink (the word count's
dead letters too) set to one delivery:
- frequency count (pipelines/examples/frequency-count.yaml): one word per record, running count per word
  (update mode: every batch writes the new count of each word it saw);
- windowed word count (pipelines/examples/wordcount.yaml): lines of 8 words, 5 s tumbling windows on the
  record timestamp, watermark 2 s (append mode: each window once, when it closes).
Words come from the 9,000-word Zipf dictionary of the frequency-count benchmark. Both deliveries run in the
same Spark session (local[2], 2 shuffle partitions), on fresh topics of SLUICE_BENCH_PARTITIONS partitions
(default 4) and fresh checkpoints.

Throughput (records/s). SLUICE_BENCH_DELIVERY_WORDS words (default 4M) and SLUICE_BENCH_DELIVERY_LINES lines
(default 400k, 3.2M words) are prefilled; each job runs with trigger availableNow, records/s = N / wall time
from asking for the query until it ended. The deliveries alternate (E A A E for SLUICE_BENCH_REPEATS=2)
after an unmeasured warm-up run of each on a tenth of N; the best run counts. Every run's output is read
back with read_committed and must equal the reference (final count per word; count per closed window).

End-to-end latency (p50/p99). Per workload and delivery, on fresh topics: a paced producer (spawned)
writes SLUICE_BENCH_DELIVERY_RATE records/s (default: a quarter of the slower delivery's throughput, at most
20,000 words/s or 2,500 lines/s) for SLUICE_BENCH_LATENCY_WARMUP (10 s) + SLUICE_BENCH_LATENCY_SECONDS (30 s),
then 10 s more so the last measured windows close; the pipeline's own trigger (1 s). A read_committed consumer
in another spawned process notes when each output record becomes visible. A record's latency runs from its
producer timestamp until the output reflecting it is visible to that consumer:
- frequency count: the word's running count after the record's micro-batch (found from the offset ranges
  each micro-batch reports);
- word count: the last of the (window, word) counts of its words; this includes waiting for the window to
  close (5 s window, 2 s watermark), the same for both deliveries.
Only records produced after the warm-up count.

Results: per workload a table (records/s, Spark rows/s, p50, p99) and exactlyOnce / atLeastOnce throughput
(target >= 0.9), printed and written to SLUICE_BENCH_OUTPUT_DELIVERY (default .sluice/bench/delivery.json).
"""

from __future__ import annotations

import json
import os
import time
from array import array
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyspark
import pytest
from bench_report import Latency, Report, SystemResult, Target, common_settings, write_json
from bench_spark import (
    EXAMPLE,
    ProgressLog,
    SluiceJob,
    Trigger,
    batch_ranges,
    processed_rows_per_second,
    run_live,
    run_to_completion,
)
from bench_workload import (
    Arrivals,
    OutputTail,
    PacedProducer,
    PartitionRecords,
    committed_records,
    end_offsets,
    final_counts,
    partition_records,
    prefill,
)
from rich.console import Console

from sluice.api.times import parse_time
from sluice.pipelines.local.kafka import KAFKA
from sluice.testbed.common import REPO_ROOT

pytestmark = [pytest.mark.bench, pytest.mark.timeout(6 * 3600)]

EXACTLY_ONCE, AT_LEAST_ONCE = "exactlyOnce", "atLeastOnce"
WORDCOUNT = REPO_ROOT / "pipelines" / "examples" / "wordcount.yaml"
WINDOW_MS, WATERMARK_MS = 5_000, 2_000  # wordcount.yaml's window and watermark
WORDS_PER_LINE = 8
console = Console(width=max(Console().width, 120))


@dataclass(frozen=True)
class DeliveryConfig:
    words: int
    lines: int
    partitions: int
    repeats: int
    latency_seconds: float
    latency_warmup: float
    latency_rate: float | None
    output: Path

    @classmethod
    def from_env(cls) -> DeliveryConfig:
        env = os.environ.get
        rate = env("SLUICE_BENCH_DELIVERY_RATE")
        return cls(
            words=int(env("SLUICE_BENCH_DELIVERY_WORDS", "4000000")),
            lines=int(env("SLUICE_BENCH_DELIVERY_LINES", "400000")),
            **common_settings(),
            latency_rate=float(rate) if rate else None,
            output=Path(env("SLUICE_BENCH_OUTPUT_DELIVERY", str(REPO_ROOT / ".sluice/bench/delivery.json"))),
        )


# ----------------------------------------------------------------------------------------- workloads


@dataclass(frozen=True)
class Workload:
    """A pipeline, its records and how its output is checked and turned into latencies."""

    title: str
    manifest: Path
    words_per_record: int
    max_rate: float  # records/s for the latency runs, at most
    tail_seconds: float  # produced after the measured window, so that its results come out

    def reference(self, bootstrap: str, topic: str, words: dict[str, int]) -> Any:
        """What the output must hold for the records now in the topic (`words`: how often each was written)."""
        if self.words_per_record == 1:
            return words
        watermark = (
            max(ts for part in partition_records(bootstrap, topic).values() for ts in part.timestamps) - WATERMARK_MS
        )
        return Counter(
            {key: n for key, n in window_counts(bootstrap, topic).items() if key[0] + WINDOW_MS <= watermark}
        )

    def output(self, bootstrap: str, sink: str) -> Any:
        if self.words_per_record == 1:
            return final_counts(bootstrap, sink)
        return Counter(
            {
                window_key(r.key(), r.value()): json.loads(r.value() or b"")["count"]
                for r in committed_records(bootstrap, sink)
            }
        )

    def latencies(
        self,
        batches: list[dict[str, Any]],
        topic: str,
        records: dict[int, PartitionRecords],
        arrivals: Arrivals,
        since_ms: float,
        until_ms: float,
    ) -> array:
        if self.words_per_record == 1:
            return running_count_latencies(batches, topic, records, arrivals, since_ms)
        return window_latencies(records, arrivals, since_ms, until_ms)


FREQUENCY_COUNT = Workload("frequency count", EXAMPLE, 1, max_rate=20_000, tail_seconds=0)
WORD_COUNT = Workload("windowed word count", WORDCOUNT, WORDS_PER_LINE, max_rate=2_500, tail_seconds=10)


def window_key(key: bytes | None, value: bytes | None) -> tuple[int, str]:
    row = json.loads(value or b"")
    return round(parse_time(row["window_start"]) * 1000), (key or b"").decode()


def window_counts(bootstrap: str, topic: str) -> Counter[tuple[int, str]]:
    """Words per (window start, word) of the lines in the topic, by their timestamps."""
    counts: Counter[tuple[int, str]] = Counter()
    for part in partition_records(bootstrap, topic).values():
        for ts, line in zip(part.timestamps, part.values, strict=True):
            counts.update((ts - ts % WINDOW_MS, word.decode()) for word in line.split())
    return counts


def running_count_latencies(
    batches: list[dict[str, Any]], topic: str, records: dict[int, PartitionRecords], arrivals: Arrivals, since_ms: float
) -> array:
    """Per word record: when (word, its running count after the record's batch) became visible - its timestamp."""
    visible = {(key, json.loads(value or b"")["count"]): ms for (key, value), ms in arrivals.items()}
    running: Counter[bytes] = Counter()
    latencies = array("d")
    for batch in batches:
        _, ranges = batch_ranges(batch, topic)
        read = [(records[p], i) for p, (start, end) in ranges.items() for i in records[p].between(start, end)]
        running.update(part.values[i] for part, i in read)
        for part, i in read:
            if part.timestamps[i] >= since_ms:
                word = part.values[i]
                latencies.append(visible[(word, running[word])] - part.timestamps[i])
    return latencies


def window_latencies(
    records: dict[int, PartitionRecords], arrivals: Arrivals, since_ms: float, until_ms: float
) -> array:
    """Per line produced in [since, until): when the last count of its words' windows became visible - its
    timestamp."""
    visible = {window_key(key, value): ms for (key, value), ms in arrivals.items()}
    latencies = array("d")
    for part in records.values():
        for ts, line in zip(part.timestamps, part.values, strict=True):
            if since_ms <= ts < until_ms:
                start = ts - ts % WINDOW_MS
                latencies.append(max(visible[(start, word.decode())] for word in set(line.split())) - ts)
    return latencies


# --------------------------------------------------------------------------------------------- bench


class DeliveryBench:
    def __init__(
        self,
        config: DeliveryConfig,
        workload: Workload,
        spark,
        bootstrap: str,
        new_topic: Callable[..., str],
        tmp: Path,
        progress: ProgressLog,
    ) -> None:
        self.config, self.workload, self.bootstrap = config, workload, bootstrap
        self.new_topic, self.tmp, self.progress = new_topic, tmp, progress
        self.jobs = [
            SluiceJob(spark, bootstrap, workload.manifest, delivery) for delivery in (EXACTLY_ONCE, AT_LEAST_ONCE)
        ]
        self.results = {job.name: SystemResult(job.name) for job in self.jobs}
        self._runs = 0

    @property
    def records(self) -> int:
        return self.config.words if self.workload.words_per_record == 1 else self.config.lines

    def topic(self, prefix: str) -> str:
        return self.new_topic(partitions=self.config.partitions, prefix=f"bench-delivery-{prefix}")

    def checkpoint(self) -> str:
        self._runs += 1
        return str(self.tmp / f"{self.workload.title.replace(' ', '-')}-{self._runs}")

    # ---------------------------------------------------------------------------- throughput
    def prefilled(self, records: int, prefix: str, seed: int) -> tuple[str, Any]:
        topic = self.topic(prefix)
        started = time.perf_counter()
        words = prefill(self.bootstrap, topic, self.config.partitions, records, seed, self.workload.words_per_record)
        console.log(f"prefilled {topic}: {records:,} records in {time.perf_counter() - started:.1f}s")
        return topic, self.workload.reference(self.bootstrap, topic, words)

    def run_job(self, job: SluiceJob, topic: str, reference: Any, records: int, measured: bool = True) -> None:
        sink = self.topic("out")
        run = run_to_completion(job, self.progress, topic, sink, self.checkpoint(), records, 300 + records / 5_000)
        assert self.workload.output(self.bootstrap, sink) == reference, f"{job.name}: wrong output"
        if measured:
            figures = self.results[job.name].add_run(records, run.seconds, processed_rows_per_second(run.batches))
            console.log(f"{self.workload.title}, {job.name}: {figures}")

    def throughput(self) -> None:
        warm_records = max(10_000, self.records // 10)
        warm_topic, warm_reference = self.prefilled(warm_records, "warm-up", seed=2)
        for job in self.jobs:
            self.run_job(job, warm_topic, warm_reference, warm_records, measured=False)
        topic, reference = self.prefilled(self.records, "in", seed=1)
        for i in range(self.config.repeats):
            for job in self.jobs if i % 2 == 0 else self.jobs[::-1]:
                self.run_job(job, topic, reference, self.records)

    # ------------------------------------------------------------------------------- latency
    def latency_rate(self) -> float:
        if self.config.latency_rate:
            return self.config.latency_rate
        slowest = min(result.records_per_s for result in self.results.values())
        return min(self.workload.max_rate, 0.25 * slowest)

    def job_latency(self, job: SluiceJob) -> None:
        topic, sink = self.topic("latency-in"), self.topic("latency-out")
        seconds = self.config.latency_warmup + self.config.latency_seconds
        tail = OutputTail(self.bootstrap, sink)
        produced = []

        def produce() -> dict[int, int]:
            tail.start()
            produced.append(
                PacedProducer(
                    self.bootstrap,
                    topic,
                    self.config.partitions,
                    self.latency_rate(),
                    seconds + self.workload.tail_seconds,
                    words_per_record=self.workload.words_per_record,
                )
                .start()
                .result(600 + seconds)
            )
            return end_offsets(self.bootstrap, topic)

        batches = run_live(
            job, self.progress, topic, sink, self.checkpoint(), Trigger(interval="1s"), produce, 600 + seconds
        )
        arrivals = tail.arrivals()
        since = produced[0].started_ms + self.config.latency_warmup * 1000
        latency = Latency.of(
            self.workload.latencies(
                batches,
                topic,
                partition_records(self.bootstrap, topic),
                arrivals,
                since,
                since + self.config.latency_seconds * 1000,
            )
        )
        latency.batches = len(batches)
        latency.mean_batch_ms = sum(b["batchDuration"] for b in batches) / len(batches)
        phases = Counter[str]()
        for batch in batches:
            phases.update(batch.get("durationMs") or {})
        latency.mean_phases_ms = {phase: round(total / len(batches), 1) for phase, total in phases.items()}
        assert latency.records, f"{job.name}: no record in the measured window"
        self.results[job.name].latency = latency
        console.log(
            f"{self.workload.title}, {job.name}: latency over {latency.records:,} records at "
            f"{self.latency_rate():,.0f}/s: p50 {latency.p50_ms:,.0f} ms, p99 {latency.p99_ms:,.0f} ms; "
            f"{latency.batches} batches of {latency.mean_batch_ms:,.0f} ms on average ({latency.mean_phases_ms})"
        )

    def report(self, spark) -> Report:
        setup = {
            "records": self.records,
            "words_per_record": self.workload.words_per_record,
            "partitions": self.config.partitions,
            "repeats": self.config.repeats,
            "latency_rate": round(self.latency_rate()),
            "latency_seconds": self.config.latency_seconds,
            "latency_warmup": self.config.latency_warmup,
            "trigger": "1s",
            "pipeline": str(self.workload.manifest.relative_to(REPO_ROOT)),
            "spark": pyspark.__version__,
            "spark_master": spark.sparkContext.master,
            "shuffle_partitions": spark.conf.get("spark.sql.shuffle.partitions"),
            "kafka": KAFKA,
            "cores": os.cpu_count(),
        }
        target = Target("exactlyOnce / atLeastOnce", self.jobs[0].name, self.jobs[1].name, 0.9)
        return Report(f"{self.workload.title}: delivery", setup, self.results, targets=(target,))


def test_delivery(kafka_bootstrap, spark_session, new_topic, tmp_path, progress_log) -> None:
    config = DeliveryConfig.from_env()
    reports = []
    for workload in (FREQUENCY_COUNT, WORD_COUNT):
        bench = DeliveryBench(config, workload, spark_session, kafka_bootstrap, new_topic, tmp_path, progress_log)
        bench.throughput()
        for job in bench.jobs:
            bench.job_latency(job)
        report = bench.report(spark_session)
        report.print(console)
        reports.append(report)
    write_json(config.output, {report.title: report.to_json() for report in reports})
    console.log(f"results written to {config.output}")
