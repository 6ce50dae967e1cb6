"""Benchmark: frequency count — sluice vs the same job hand-written in PySpark vs the raw Kafka consumer.

Workload. A 9,000-word dictionary (seeded, so the same on every run) and words drawn from it with
Zipf(1) frequencies, like natural text. One record = one word, no key. SLUICE_BENCH_RECORDS records
(default 10M) are written once, before anything is measured, to a topic of SLUICE_BENCH_PARTITIONS
partitions (default 4) by spawned producer processes; the counts of what was written are the reference.

The job. Read the words, count per word (running counts, no window), write every changed count to
Kafka in update mode (key: the word, value: the count). sluice runs the pipeline of
pipelines/examples/frequency-count.yaml through PipelineRun (the runtime the runner uses); the
hand-written job is the same thing in plain PySpark. Both run in the same Spark session (local[2],
2 shuffle partitions, the same state store) with the same trigger, fresh checkpoints and fresh output
topics on every run.

Throughput (records/s). On the prefilled topic:
- raw consumer: one confluent-kafka consumer fetching every record, no processing — the limit;
- sluice and hand-written: trigger availableNow; records/s = N / (wall time from asking for the query
  until it ended), so query start-up is included for both. Spark's own processedRowsPerSecond is shown
  beside it. They alternate (S H H S ... for SLUICE_BENCH_REPEATS=2) after an unmeasured warm-up run (a tenth of N)
  of each on a small topic, and the best run of each counts.
After every Spark run the output topic is read back and the final count of every word must equal the
reference: the benchmark fails on a wrong result, never on a slow one.

End-to-end latency (p50/p99). For each system in turn, on a fresh topic: a paced producer (spawned
process) writes SLUICE_BENCH_LATENCY_RATE records/s (default half the slower Spark throughput, at most
SLUICE_BENCH_LATENCY_MAX_RATE) for SLUICE_BENCH_LATENCY_WARMUP + SLUICE_BENCH_LATENCY_SECONDS; only
records produced after the warm-up count. A record's latency starts at its producer timestamp (Kafka
CreateTime, set when produce() is called) and ends:
- raw consumer: when consume() hands it to the consuming process;
- Spark jobs: when the micro-batch that read it committed (its output is in Kafka by then) =
  progress.timestamp (trigger start) + batchDuration, the batch being found from the offset range
  each progress event reports per partition. The trigger is the pipeline's own (SLUICE_BENCH_TRIGGER
  overrides it, e.g. 0s for back-to-back micro-batches), the same for both jobs.
The latency runs' outputs are checked against what the paced producer wrote, too.

Results: a table (records/s, Spark rows/s, p50, p99), the ratios sluice/hand-written (target >= 0.95)
and sluice/raw consumer (target >= 0.5) with PASS/MISS, and the same as JSON in SLUICE_BENCH_OUTPUT
(default .sluice/bench/frequency-count.json, git-ignored).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyspark
import pytest
from bench_report import Latency, Report, SystemResult, common_settings
from bench_spark import (
    HandWrittenJob,
    Job,
    ProgressLog,
    SluiceJob,
    Trigger,
    batch_latencies,
    batch_ranges,
    processed_rows_per_second,
    run_live,
    run_to_completion,
)
from bench_workload import (
    DICTIONARY_SIZE,
    Paced,
    PacedProducer,
    end_offsets,
    final_counts,
    prefill,
    raw_consume_latencies,
    raw_consume_seconds,
    record_timestamps,
)
from rich.console import Console

from sluice.pipelines.local.kafka import KAFKA
from sluice.testbed.common import REPO_ROOT

pytestmark = [pytest.mark.bench, pytest.mark.timeout(6 * 3600)]

RAW, HAND, SLUICE = "raw consumer", "hand-written", "sluice"
console = Console(width=max(Console().width, 120))  # a log file is not an 80-column terminal


@dataclass(frozen=True)
class BenchConfig:
    records: int
    partitions: int
    repeats: int
    latency_seconds: float
    latency_warmup: float
    latency_rate: float | None  # None: derived from the measured throughput
    latency_max_rate: float
    trigger: str | None  # None: the pipeline's own
    output: Path

    @classmethod
    def from_env(cls) -> BenchConfig:
        env = os.environ.get
        rate = env("SLUICE_BENCH_LATENCY_RATE")
        return cls(
            records=int(env("SLUICE_BENCH_RECORDS", "10000000")),
            **common_settings(),
            latency_rate=float(rate) if rate else None,
            latency_max_rate=float(env("SLUICE_BENCH_LATENCY_MAX_RATE", "50000")),
            trigger=env("SLUICE_BENCH_TRIGGER") or None,
            output=Path(env("SLUICE_BENCH_OUTPUT", str(REPO_ROOT / ".sluice/bench/frequency-count.json"))),
        )

    @property
    def run_timeout(self) -> float:
        return 300 + self.records / 10_000


class Bench:
    """One benchmark session: the broker, the Spark session, the two jobs and where results go."""

    def __init__(
        self,
        config: BenchConfig,
        bootstrap: str,
        new_topic: Callable[..., str],
        tmp: Path,
        progress: ProgressLog,
        jobs: list[Job],
    ) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.new_topic = new_topic
        self.tmp = tmp
        self.progress = progress
        self.jobs = jobs
        self.results = {name: SystemResult(name) for name in (RAW, HAND, SLUICE)}
        self._checkpoints = 0

    def topic(self, prefix: str) -> str:
        return self.new_topic(partitions=self.config.partitions, prefix=f"bench-{prefix}")

    def checkpoint(self, job: Job) -> str:
        self._checkpoints += 1
        return str(self.tmp / f"{job.name}-{self._checkpoints}")

    # ------------------------------------------------------------------------------ throughput
    def prefill(self, records: int, prefix: str, seed: int) -> tuple[str, dict[str, int]]:
        topic = self.topic(prefix)
        started = time.perf_counter()
        reference = prefill(self.bootstrap, topic, self.config.partitions, records, seed)
        seconds = time.perf_counter() - started
        console.log(f"prefilled {topic}: {records:,} records in {seconds:.1f}s ({records / seconds:,.0f}/s)")
        return topic, reference

    def run_job(self, job: Job, topic: str, reference: dict[str, int], measured: bool = True) -> None:
        records = sum(reference.values())
        sink = self.topic(f"{job.name}-counts")
        run = run_to_completion(job, self.progress, topic, sink, self.checkpoint(job), records, self.config.run_timeout)
        assert final_counts(self.bootstrap, sink) == reference, f"{job.name}: wrong final counts"
        if measured:
            figures = self.results[job.name].add_run(records, run.seconds, processed_rows_per_second(run.batches))
            console.log(f"{job.name}: {figures}")

    def run_raw(self, topic: str, records: int) -> None:
        seconds = raw_consume_seconds(self.bootstrap, topic, records, self.config.run_timeout)
        self.results[RAW].runs_records_per_s.append(records / seconds)
        console.log(f"{RAW}: {records:,} records in {seconds:.2f}s ({records / seconds:,.0f}/s)")

    def throughput(self) -> None:
        # The first large run in a JVM pays for class loading and JIT: a 50k warm-up was not enough (the
        # first 10M run came out ~45% slower whichever job it was), so warm up on a tenth of the data.
        warm_topic, warm_reference = self.prefill(
            min(self.config.records, max(50_000, self.config.records // 10)), "warm-up", seed=2
        )
        for job in self.jobs:
            self.run_job(job, warm_topic, warm_reference, measured=False)
        topic, reference = self.prefill(self.config.records, "words", seed=1)
        for _ in range(self.config.repeats):
            self.run_raw(topic, self.config.records)
        for job in alternating(self.jobs, self.config.repeats):
            self.run_job(job, topic, reference)

    # --------------------------------------------------------------------------------- latency
    def latency_rate(self) -> float:
        if self.config.latency_rate:
            return self.config.latency_rate
        slowest = min(self.results[job.name].records_per_s for job in self.jobs)
        return min(self.config.latency_max_rate, 0.5 * slowest)

    def paced(self, topic: str) -> PacedProducer:
        seconds = self.config.latency_warmup + self.config.latency_seconds
        return PacedProducer(self.bootstrap, topic, self.config.partitions, self.latency_rate(), seconds)

    def since(self, paced: Paced) -> float:
        return paced.started_ms + self.config.latency_warmup * 1000

    def raw_latency(self) -> None:
        topic = self.topic("latency-raw")
        stamps, latencies, paced = raw_consume_latencies(
            self.bootstrap, topic, self.paced(topic).start(), self.config.run_timeout
        )
        since = self.since(paced)
        self.record_latency(RAW, Latency.of([lat for ts, lat in zip(stamps, latencies, strict=True) if ts >= since]))

    def job_latency(self, job: Job, trigger: Trigger) -> None:
        topic, sink = self.topic(f"latency-{job.name}"), self.topic(f"latency-{job.name}-counts")
        produced: list[Paced] = []

        def produce() -> dict[int, int]:
            produced.append(self.paced(topic).start().result(self.config.run_timeout))
            return end_offsets(self.bootstrap, topic)

        batches = run_live(
            job, self.progress, topic, sink, self.checkpoint(job), trigger, produce, self.config.run_timeout
        )
        assert final_counts(self.bootstrap, sink) == produced[0].counts, f"{job.name}: wrong final counts"
        times = record_timestamps(self.bootstrap, topic)
        latency = Latency.of(batch_latencies(batches, topic, times, self.since(produced[0])))
        latency.batches = len(batches)
        latency.mean_batch_ms = sum(b["batchDuration"] for b in batches) / len(batches)
        latency.catch_up_ms = batch_ranges(batches[-1], topic)[0] - produced[0].ended_ms
        self.record_latency(job.name, latency)

    def record_latency(self, name: str, latency: Latency) -> None:
        assert latency.records, f"{name}: no record in the measured window"
        self.results[name].latency = latency
        batches = (
            (
                f"; {latency.batches} batches of {latency.mean_batch_ms:,.0f} ms on average, "
                f"caught up {latency.catch_up_ms:,.0f} ms after the last record"
            )
            if latency.batches
            else ""
        )
        console.log(
            f"{name}: latency over {latency.records:,} records: p50 {latency.p50_ms:,.0f} ms, "
            f"p99 {latency.p99_ms:,.0f} ms, max {latency.max_ms:,.0f} ms{batches}"
        )

    def latency(self, trigger: Trigger) -> None:
        console.log(
            f"latency: {self.latency_rate():,.0f} records/s for {self.config.latency_warmup:.0f}s "
            f"warm-up + {self.config.latency_seconds:.0f}s measured, trigger {trigger.interval}"
        )
        self.raw_latency()
        for job in self.jobs:
            self.job_latency(job, trigger)


def alternating(jobs: list[Job], repeats: int) -> list[Job]:
    """A B, B A, A B, ...: neither job always runs first (on a warmer JVM, a fuller disk cache)."""
    return [job for i in range(repeats) for job in (jobs if i % 2 == 0 else jobs[::-1])]


def test_frequency_count(kafka_bootstrap, spark_session, new_topic, tmp_path, progress_log) -> None:
    config = BenchConfig.from_env()
    sluice = SluiceJob(spark_session, kafka_bootstrap)
    bench = Bench(
        config,
        kafka_bootstrap,
        new_topic,
        tmp_path,
        progress_log,
        [sluice, HandWrittenJob(spark_session, kafka_bootstrap)],
    )
    trigger = Trigger(interval=config.trigger or sluice.default_interval)

    bench.throughput()
    bench.latency(trigger)

    report = Report(
        "frequency count",
        {
            "records": config.records,
            "partitions": config.partitions,
            "dictionary": DICTIONARY_SIZE,
            "repeats": config.repeats,
            "latency_rate": round(bench.latency_rate()),
            "latency_seconds": config.latency_seconds,
            "latency_warmup": config.latency_warmup,
            "trigger": trigger.interval,
            "pipeline": sluice.source,
            "spark": pyspark.__version__,
            "spark_master": spark_session.sparkContext.master,
            "shuffle_partitions": spark_session.conf.get("spark.sql.shuffle.partitions"),
            "kafka": KAFKA,
            "cores": os.cpu_count(),
        },
        bench.results,
    )
    report.print(console)
    report.write(config.output)
    console.log(f"results written to {config.output}")
