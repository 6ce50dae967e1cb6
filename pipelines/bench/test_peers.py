"""Benchmark: sluice side by side with the engines users would pick instead, in one run (`make bench-peers`).

Workloads (peer_workloads.py): the frequency count, the windowed word count and a stateless filter +
projection. Systems (bench_peers.SYSTEMS), each at its best settings for the guarantee of its output, which
peers.json records beside its figures (systems compare within one guarantee):
- exactly-once: `sluice` (`sluice run` on the manifests in pipelines/bench/peers; delivery exactlyOnce, the
  default), `pyflink-eos` (checkpoints and transactional Kafka sinks), `quixstreams-eos`
  (processing_guarantee exactly-once);
- at-least-once: `sluice-alo` (the same manifests with delivery atLeastOnce), `sluice-realtime` (real-time
  mode, stateless workload only), `hand-written` (the jobs in plain PySpark with Spark's defaults),
  `hand-tuned` (the same with a Spark expert's settings), `pyflink` (no checkpointing), `quixstreams`,
  `bytewax`;
- `limit`: raw confluent-kafka consumers, one per core, reading the topic in parallel, no processing.
The peers are peers/*_job.py, each in its own virtualenv under ~/.cache/sluice/bench-peers. Every job runs as
its own process with 2 cores' worth of parallelism, reads the same topic (4 partitions) and is checked by a
read_committed consumer: a wrong output (a count off, a record missing or written twice) fails the benchmark.

Throughput. Per workload one prefilled topic of SLUICE_BENCH_PEERS_RECORDS records (default 6M; the windowed
word count's are lines of 5 words), and one of a tenth of it for the Python-native engines
(Quix Streams, Bytewax), which would take many minutes per run otherwise. A run lasts from the job's
launch until its output equals the reference (a read_committed consumer watches it). Start-up is taken out by
a small run (SLUICE_BENCH_PEERS_STARTUP_RECORDS, default 10k) just before each measured one: records/s =
(N - n) / (t(N) - t(n)). The figure is the median of SLUICE_BENCH_PEERS_REPEATS (default 5; #37's targets need
at least 5) such pairs, the systems' order alternating. The limit reads the full topic once per repeat: one
consumer per core, started and imported before the clock, from the first consumer's first read to the last's
end.

Latency. For each system on fresh topics at half of its own median throughput (at most
SLUICE_BENCH_LATENCY_MAX_RATE, default 50k records/s — one producer process): the job is started, primed
until its first output, then a paced producer writes for SLUICE_BENCH_LATENCY_WARMUP +
SLUICE_BENCH_LATENCY_SECONDS (default 5 + 20 s). Per record produced after the warm-up: from its producer
timestamp until its effect is visible to the read_committed consumer (a count reaching its occurrence, or its
projected record; stamped when the consumer has the record). The limit's latency is one consumer's arrival time.
p50 and p99 are the medians over SLUICE_BENCH_PEERS_REPEATS runs, the systems' order alternating. An
exactly-once peer's commit interval is its visibility floor, and so is PyFlink's mini-batch latency at least once:
their latency runs use the setting with the best p99 in a sweep before them (one run per setting of
bench_peers.System.intervals), recorded with the sweep.

A system that fails (a wrong output, a timeout, a crash) is recorded with its error and the others go on; the
benchmark fails at the end.

Outputs: .sluice/bench/peers.json ({"workloads": {NAME: {"systems": {SYSTEM: {"guarantee", "records_per_s",
"p50_ms", "p99_ms", ...}}}}}), .sluice/bench/peers.png and docs/benchmarks.md (generated).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pyspark
import pytest
from bench_peers import (
    GUARANTEES,
    LIMIT,
    PYFLINK_CHECKPOINT_INTERVAL,
    QUIXSTREAMS_EOS_COMMIT_INTERVAL,
    SYSTEMS,
    Launch,
    OutputWatch,
    Running,
    System,
    checked,
    input_records,
    read_partitions,
    ready,
    reference_of,
    run_job,
)
from bench_report import Latency, write_json
from bench_workload import PacedProducer, _spawn, end_offsets, prefill, raw_consume_latencies
from peer_workloads import WORKLOADS, Reference, Workload, latencies
from peers_report import publish, targets_of
from rich.console import Console

from sluice.pipelines.local.kafka import KAFKA
from sluice.testbed.common import REPO_ROOT

pytestmark = [pytest.mark.bench, pytest.mark.timeout(8 * 3600)]
console = Console(width=max(Console().width, 120))
PARTITIONS = 4
PRIMER_SECONDS = 3.0  # of 100 records/s before a latency run: the job's first output proves it runs


@dataclass(frozen=True)
class PeersConfig:
    records: int
    startup_records: int
    repeats: int
    latency_seconds: float
    latency_warmup: float
    latency_max_rate: float
    systems: tuple[str, ...]
    workloads: tuple[str, ...]
    output: Path

    @classmethod
    def from_env(cls) -> PeersConfig:
        env = os.environ.get
        return cls(
            records=int(env("SLUICE_BENCH_PEERS_RECORDS", "6000000")),
            startup_records=int(env("SLUICE_BENCH_PEERS_STARTUP_RECORDS", "10000")),
            repeats=int(env("SLUICE_BENCH_PEERS_REPEATS", "5")),
            latency_seconds=float(env("SLUICE_BENCH_LATENCY_SECONDS", "20")),
            latency_warmup=float(env("SLUICE_BENCH_LATENCY_WARMUP", "5")),
            latency_max_rate=float(env("SLUICE_BENCH_LATENCY_MAX_RATE", "50000")),
            systems=tuple(env("SLUICE_BENCH_PEERS_SYSTEMS", ",".join(s.name for s in SYSTEMS)).split(",")),
            workloads=tuple(env("SLUICE_BENCH_PEERS_WORKLOADS", ",".join(WORKLOADS)).split(",")),
            output=Path(env("SLUICE_BENCH_PEERS_OUTPUT", str(REPO_ROOT / ".sluice/bench/peers.json"))),
        )

    def __post_init__(self) -> None:
        if self.records // 10 <= self.startup_records:
            raise ValueError(
                f"SLUICE_BENCH_PEERS_RECORDS ({self.records:,}) must be over 10x SLUICE_BENCH_PEERS_STARTUP_RECORDS "
                f"({self.startup_records:,}): the Python-native engines read a tenth of it"
            )

    def records_for(self, system: System, workload: Workload) -> int:
        """Records of the workload's throughput topic for this system: a tenth for the Python-native engines."""
        return self.records // 10 if system.slow else self.records

    def timeout(self, records: int, workload: Workload) -> float:
        """A run's bound: 5,000 words a second at the least, besides the start."""
        return 180 + records * workload.words_per_record / 5_000


@dataclass
class Figures:
    guarantee: str | None  # of the system's output; None for the limit, which writes nothing
    runs_records_per_s: list[float] = field(default_factory=list)
    startup_s: float | None = None
    records: int = 0
    latency: Latency | None = None
    latency_rate: float | None = None
    latency_runs: list[Latency] = field(default_factory=list)
    latency_interval: str | None = None  # the setting its latency runs used (a swept system's)
    latency_setting: str | None = None  # what that setting is, as the page says it ("commits every 1 s")
    latency_sweep: dict[str, dict[str, float]] = field(default_factory=dict)  # interval -> p50_ms, p99_ms
    outputs: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def records_per_s(self) -> float | None:
        """The runs' median; None when no run finished (the system failed)."""
        return statistics.median(self.runs_records_per_s) if self.runs_records_per_s else None

    def to_json(self) -> dict[str, Any]:
        latency = self.latency
        return {
            "guarantee": self.guarantee,
            "records_per_s": self.records_per_s,
            "p50_ms": latency.p50_ms if latency else None,
            "p99_ms": latency.p99_ms if latency else None,
            "runs_records_per_s": self.runs_records_per_s,
            "records": self.records,
            "startup_s": self.startup_s,
            "output_records": self.outputs,
            "latency_rate": self.latency_rate,
            # the latency rate over the system's own throughput: 0.5, or less where the producer's cap held it
            "latency_load": round(self.latency_rate / self.records_per_s, 3)
            if self.latency_rate and self.records_per_s
            else None,
            "latency_records": latency.records if latency else None,
            "max_ms": latency.max_ms if latency else None,
            "latency_runs": [{"p50_ms": run.p50_ms, "p99_ms": run.p99_ms} for run in self.latency_runs],
            "latency_interval": self.latency_interval,
            "latency_setting": self.latency_setting,
            "latency_sweep": self.latency_sweep,
            "errors": self.errors,
        }

    def add_latency(self, run: Latency) -> None:
        """One more latency run: the figure is the runs' median p50 and p99."""
        self.latency_runs.append(run)
        runs = self.latency_runs
        self.latency = Latency(
            sum(r.records for r in runs),
            statistics.median(r.p50_ms for r in runs),
            statistics.median(r.p99_ms for r in runs),
            max(r.max_ms for r in runs),
        )


class PeersBench:
    def __init__(self, config: PeersConfig, bootstrap: str, new_topic: Callable[..., str], tmp: Path) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.new_topic = new_topic
        self.tmp = tmp
        self.systems = [s for s in SYSTEMS if s.name in config.systems]
        self._runs = 0

    def launch(self, workload: Workload, source: str, name: str) -> Launch:
        self._runs += 1
        sink = self.new_topic(partitions=PARTITIONS, prefix=f"peers-{name}-out")
        return Launch(workload, self.bootstrap, source, sink, self.tmp / f"{self._runs:03d}-{name}-{workload.name}")

    def prefilled(self, workload: Workload, records: int, seed: int) -> tuple[str, Any]:
        topic = self.new_topic(partitions=PARTITIONS, prefix=f"peers-{workload.name}")
        started = time.perf_counter()
        prefill(self.bootstrap, topic, PARTITIONS, records, seed, workload.words_per_record, workload.keyed)
        reference = reference_of(workload, self.bootstrap, topic)
        console.log(f"{topic}: {records:,} records written and read back in {time.perf_counter() - started:.1f}s")
        return topic, reference

    # ---------------------------------------------------------------------------------- throughput
    def throughput(self, workload: Workload, figures: dict[str, Figures]) -> None:
        systems = [s for s in self.systems if s.runs(workload)]
        small = self.prefilled(workload, self.config.startup_records, seed=3)
        sizes = sorted({self.config.records_for(s, workload) for s in systems})
        topics = {n: self.prefilled(workload, n, seed=1) for n in sizes}
        limit = figures.setdefault(LIMIT, Figures(None, records=max(sizes)))
        startups: dict[str, list[float]] = {}
        for repeat in range(self.config.repeats):
            seconds = self.limit_seconds(topics[max(sizes)][0], max(sizes))
            limit.runs_records_per_s.append(max(sizes) / seconds)
            console.log(f"{workload.name}: {LIMIT}: {max(sizes):,} records in {seconds:.2f}s")
            for system in systems if repeat % 2 == 0 else systems[::-1]:
                records = self.config.records_for(system, workload)
                own = figures.setdefault(system.name, Figures(system.guarantee, records=records))
                if own.errors:
                    continue  # failed once: its figures would not be comparable
                try:
                    startup = self.seconds(system, workload, *small)
                    seconds = self.seconds(system, workload, *topics[records])
                    assert seconds > startup, (
                        f"{system.name}: {records:,} records took {seconds:.1f}s, no longer than the start-up run "
                        f"before it ({startup:.1f}s): raise SLUICE_BENCH_PEERS_RECORDS"
                    )
                except (AssertionError, RuntimeError, TimeoutError) as error:
                    own.errors.append(f"throughput: {error}")
                    console.log(f"[red]{workload.name}: {system.name} failed:[/] {error}")
                    continue
                rate = (records - self.config.startup_records) / (seconds - startup)
                own.runs_records_per_s.append(rate)
                startups.setdefault(system.name, []).append(startup)
                own.startup_s = statistics.median(startups[system.name])
                console.log(
                    f"{workload.name}: {system.name}: {records:,} records in {seconds:.1f}s, "
                    f"{self.config.startup_records:,} in {startup:.1f}s -> {rate:,.0f} records/s"
                )

    def seconds(self, system: System, workload: Workload, topic: str, reference: Any) -> float:
        launch = self.launch(workload, topic, system.name)
        seconds, _ = run_job(system, launch, reference, self.config.timeout(reference.records, workload))
        return seconds

    def limit_seconds(self, topic: str, records: int) -> float:
        """One raw consumer per core, each on its share of the partitions, all at once: from the first one's first
        read to the last one's end. Every worker has started and imported what it runs before any reads."""
        cores = os.cpu_count() or 2
        partitions = sorted(end_offsets(self.bootstrap, topic))
        shares = [(self.bootstrap, topic, partitions[i::cores]) for i in range(cores)]
        context = _spawn()
        tokens = context.Queue()
        with context.Pool(cores, initializer=ready, initargs=(tokens,)) as pool:
            for _ in range(cores):
                tokens.get(timeout=120)
            read = pool.starmap(read_partitions, shares)
        assert sum(n for n, _, _ in read) == records, f"the limit read {sum(n for n, _, _ in read):,} of {records:,}"
        return max(end for _, _, end in read) - min(began for _, began, _ in read)

    # -------------------------------------------------------------------------------------- latency
    def rate(self, figures: Figures) -> float:
        assert figures.records_per_s is not None, "a latency run needs the system's throughput"
        return min(self.config.latency_max_rate, 0.5 * figures.records_per_s)

    def paced(
        self, workload: Workload, topic: str, rate: float, seed: int = 7, seconds: float | None = None
    ) -> PacedProducer:
        seconds = seconds or self.config.latency_warmup + self.config.latency_seconds
        return PacedProducer(
            self.bootstrap, topic, PARTITIONS, rate, seconds, seed, workload.words_per_record, workload.keyed
        )

    def latency(self, workload: Workload, figures: dict[str, Figures]) -> None:
        """The sweeps first, then SLUICE_BENCH_PEERS_REPEATS rounds of every system, the order alternating."""
        systems = [s for s in self.systems if s.runs(workload) and not figures[s.name].errors]
        for system in systems:
            if system.swept(workload):
                self.sweep(system, workload, figures[system.name])
        for repeat in range(self.config.repeats):
            self.limit_latency(workload, figures[LIMIT])
            for system in systems if repeat % 2 == 0 else systems[::-1]:
                own = figures[system.name]
                if own.errors:
                    continue
                try:
                    own.add_latency(self.system_latency(system, workload, own, own.latency_interval))
                except (AssertionError, RuntimeError, TimeoutError) as error:
                    own.errors.append(f"latency: {error}")
                    console.log(f"[red]{workload.name}: {system.name} failed:[/] {error}")
                    continue
                self.log_latency(workload, system.name, own)

    def sweep(self, system: System, workload: Workload, figures: Figures) -> None:
        """A swept system's latency at each of its settings (an exactly-once peer's commit interval, PyFlink's
        mini-batch latency): its runs use the best p99's."""
        for interval in system.swept(workload):
            try:
                run = self.system_latency(system, workload, figures, interval)
            except (AssertionError, RuntimeError, TimeoutError) as error:
                console.log(f"[yellow]{workload.name}: {system.name} at {interval}: {error}")
                continue
            figures.latency_sweep[interval] = {"p50_ms": run.p50_ms, "p99_ms": run.p99_ms}
            at = f"{workload.name}: {system.name} at {interval}"
            console.log(f"{at}: p50 {run.p50_ms:,.0f}, p99 {run.p99_ms:,.0f} ms")
        if not figures.latency_sweep:
            figures.errors.append(f"latency: no setting of {system.swept(workload)} ran")
            return
        figures.latency_interval = min(figures.latency_sweep, key=lambda i: figures.latency_sweep[i]["p99_ms"])
        figures.latency_setting = f"{system.sweeps} {figures.latency_interval}"

    def limit_latency(self, workload: Workload, limit: Figures) -> None:
        limit.latency_rate = self.rate(limit)
        topic = self.new_topic(partitions=PARTITIONS, prefix=f"peers-{workload.name}-latency-limit")
        paced = self.paced(workload, topic, limit.latency_rate).start()
        stamps, lags, done = raw_consume_latencies(self.bootstrap, topic, paced, 600)
        since = done.started_ms + self.config.latency_warmup * 1000
        limit.add_latency(Latency.of([lag for ts, lag in zip(stamps, lags, strict=True) if ts >= since]))
        self.log_latency(workload, LIMIT, limit)

    def system_latency(self, system: System, workload: Workload, figures: Figures, interval: str | None) -> Latency:
        """One latency run of the system (at the swept setting `interval`, for a swept system)."""
        figures.latency_rate = rate = self.rate(figures)
        topic = self.new_topic(partitions=PARTITIONS, prefix=f"peers-{workload.name}-latency")
        launch = replace(self.launch(workload, topic, f"{system.name}-latency"), interval=interval)
        watch = OutputWatch(self.bootstrap, launch.sink, keep_arrivals=True)
        job = Running.start(system, launch)
        try:
            primer = self.paced(workload, topic, 100, seed=11, seconds=PRIMER_SECONDS)
            primer.start().result(120)
            job.wait(watch.first_output, 300, "no output for the first records")
            paced = self.paced(workload, topic, rate).start().result(600)
            inputs = [record for batch in input_records(self.bootstrap, topic) for record in batch]
            reference = Reference(workload)
            reference.add(inputs)  # what was just read, not a second read of the topic
            watch.expect(reference)
            job.wait(watch.done, 300, "output not complete after the paced run")
        finally:
            job.stop()
        watched = checked(system, launch, watch.finish())
        since = paced.started_ms + self.config.latency_warmup * 1000
        figures.outputs.append(watched.outputs)
        run = Latency.of(latencies(workload, inputs, watched.arrivals, since))
        assert run.records, f"{system.name}: no record in the measured window"
        return run

    @staticmethod
    def log_latency(workload: Workload, name: str, figures: Figures) -> None:
        latency = figures.latency
        assert latency is not None and latency.records, f"{name}: no record in the measured window"
        console.log(
            f"{workload.name}: {name}: latency at {figures.latency_rate:,.0f} records/s over {latency.records:,} "
            f"records: p50 {latency.p50_ms:,.0f} ms, p99 {latency.p99_ms:,.0f} ms, max {latency.max_ms:,.0f} ms"
        )


def versions() -> dict[str, str]:
    return {
        "pyspark": pyspark.__version__,
        "kafka": KAFKA,
        "apache-flink": "2.0.2 (flink-sql-connector-kafka 4.0.1-2.0)",
        "quixstreams": "3.28.1",
        "bytewax": "0.21.1",
        "python": platform.python_version(),
    }


def test_peers(kafka_bootstrap, new_topic, tmp_path) -> None:
    config = PeersConfig.from_env()
    bench = PeersBench(config, kafka_bootstrap, new_topic, tmp_path)
    results: dict[str, Any] = {
        "setup": {
            "records": config.records,
            "records_python_engines": config.records // 10,
            "startup_records": config.startup_records,
            "repeats": config.repeats,
            "partitions": PARTITIONS,
            "latency_seconds": config.latency_seconds,
            "latency_warmup": config.latency_warmup,
            "latency_max_rate": config.latency_max_rate,
            "pyflink_checkpoint_interval": PYFLINK_CHECKPOINT_INTERVAL,
            "quixstreams_commit_interval": f"{QUIXSTREAMS_EOS_COMMIT_INTERVAL} s",
            "command": "make bench-peers",
        },
        "machine": {"platform": platform.platform(), "cores": os.cpu_count(), "memory_gib": _memory_gib()},
        "versions": versions(),
        "workloads": {},
    }
    if config.output.exists():  # a run of some workloads keeps the others' last figures (each says when)
        kept = json.loads(config.output.read_text()).get("workloads", {})
        results["workloads"] = {name: data for name, data in kept.items() if name not in config.workloads}
        for data in results["workloads"].values():  # figures from before peers.json recorded guarantees
            for name, system in data["systems"].items():
                system.setdefault("guarantee", GUARANTEES.get(name))
    for name in config.workloads:
        workload = WORKLOADS[name]
        figures: dict[str, Figures] = {}
        bench.throughput(workload, figures)
        bench.latency(workload, figures)
        results["workloads"][name] = {
            "measured_at": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
            "words_per_record": workload.words_per_record,
            "systems": {system: f.to_json() for system, f in figures.items()},
        }
        write_json(config.output, results)  # what is measured so far survives a later failure
    results["workloads"] = {name: results["workloads"][name] for name in WORKLOADS if name in results["workloads"]}
    results["targets"] = targets_of(results)
    write_json(config.output, results)
    chart, docs = config.output.with_suffix(".png"), REPO_ROOT / "docs" / "benchmarks.md"
    publish(results, docs, chart)
    for target in results["targets"]:
        console.log(f"{'met ' if target['met'] else 'MISS'} {target['label']}: {target['value']}")
    console.log(f"results: {config.output}, {chart}, {docs}")
    failed = {
        f"{workload}/{name}": system["errors"]
        for workload, data in results["workloads"].items()
        for name, system in data["systems"].items()
        if system.get("errors")
    }
    assert not failed, f"systems that failed (their figures are left out): {failed}"


def _memory_gib() -> float:
    pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    return round(pages * size / (1 << 30), 1)
