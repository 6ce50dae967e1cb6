"""Running one engine's job on one workload and watching its output (peer_workloads.py has the contract).

Every system but the limit runs as its own process — its own virtualenv for the peers, so their pins never
meet pyspark's — and is stopped with SIGTERM once its output is complete. A spawned process reads the output
topic (read_committed) as it grows: it notes when the output became complete and, for latency runs, when each
(group, count) or key was first visible.
"""

from __future__ import annotations

import hashlib
import os
import queue
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from threading import Event
from typing import Any

import yaml
from bench_workload import (
    CONSUMER_CONF,
    _assigned_consumer,
    _drain,
    _fetched,
    _spawn,
    end_offsets,
    records_to_end,
)
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Message, TopicPartition
from peer_workloads import Arrival, InputRecord, OutputState, Reference, Workload
from peers.peer_process import AT_LEAST_ONCE, EXACTLY_ONCE

from sluice.pipelines.local.provision import ManagedProcess, cache_dir, locked, tail, virtualenv
from sluice.testbed.common import REPO_ROOT

PEERS_DIR = Path(__file__).parent / "peers"
FLINK_CONNECTOR = ("org.apache.flink", "flink-sql-connector-kafka", "4.0.1-2.0")
MAVEN_CENTRAL = "https://repo1.maven.org/maven2"


# ------------------------------------------------------------------------------------- environments


@dataclass(frozen=True)
class PeerEnv:
    """A virtualenv of its own under the sluice cache, keyed by the engine's version."""

    name: str
    requirements: tuple[str, ...]

    def python(self) -> Path:
        return virtualenv(cache_dir("bench-peers") / self.name, self.requirements)


PYFLINK = PeerEnv("pyflink-2.0.2", ("apache-flink==2.0.2",))
QUIXSTREAMS = PeerEnv("quixstreams-3.28.1", ("quixstreams==3.28.1",))
BYTEWAX = PeerEnv("bytewax-0.21.1", ("bytewax==0.21.1", "confluent-kafka"))


def maven_jar(group: str, artifact: str, version: str) -> Path:
    """One jar from Maven Central into the cache, checked against its published SHA-1."""
    dest = cache_dir("bench-peers", "jars") / f"{artifact}-{version}.jar"
    with locked(dest.parent / f".{dest.name}.lock"):
        if not dest.exists():
            url = f"{MAVEN_CENTRAL}/{group.replace('.', '/')}/{artifact}/{version}/{artifact}-{version}.jar"
            with urllib.request.urlopen(url, timeout=120) as response:
                data = response.read()
            with urllib.request.urlopen(url + ".sha1", timeout=60) as response:
                expected = response.read().decode().split()[0]
            if hashlib.sha1(data).hexdigest() != expected:
                raise RuntimeError(f"{url}: SHA-1 does not match the published one")
            partial = dest.with_suffix(".part")
            partial.write_bytes(data)
            partial.rename(dest)
    return dest


# -------------------------------------------------------------------------------------------- systems


@dataclass(frozen=True)
class Launch:
    """Where one run reads and writes, its own scratch folder, and the swept setting a system runs with (an
    exactly-once peer's commit interval, PyFlink's mini-batch latency; None: its default here)."""

    workload: Workload
    bootstrap: str
    source: str
    sink: str
    workdir: Path
    interval: str | None = None


@dataclass(frozen=True)
class System:
    name: str
    command: Callable[[Launch], list[str]]
    guarantee: str  # of its output: AT_LEAST_ONCE or EXACTLY_ONCE; systems compare within one
    workloads: frozenset[str] | None = None  # None: all
    slow: bool = False  # reads the short topic (a tenth of the records) in throughput runs
    intervals: tuple[str, ...] = ()  # settings its latency is measured at, the best p99's kept (a sweep)
    sweeps: str = "commits every"  # what an interval sets, as the page says it
    sweeps_stateless: bool = True  # False: the setting changes nothing without an aggregation

    def swept(self, workload: Workload) -> tuple[str, ...]:
        """The settings its latency runs on `workload` are swept over (none: its default)."""
        return self.intervals if workload.stateful or self.sweeps_stateless else ()

    def runs(self, workload: Workload) -> bool:
        return self.workloads is None or workload.name in self.workloads


CORES = os.cpu_count() or 2


def _contract_args(launch: Launch) -> list[str]:
    return [
        "--workload",
        launch.workload.name,
        "--bootstrap",
        launch.bootstrap,
        "--source",
        launch.source,
        "--sink",
        launch.sink,
        "--cores",
        str(CORES),
    ]


def _hand_written(variant: str) -> Callable[[Launch], list[str]]:
    def command(launch: Launch) -> list[str]:
        script = str(PEERS_DIR / "spark_job.py")
        checkpoint = str(launch.workdir / "checkpoint")
        return [sys.executable, script, "--variant", variant, "--checkpoint", checkpoint, *_contract_args(launch)]

    return command


def _sluice(manifest_prefix: str, cores: int, delivery: str | None = None) -> Callable[[Launch], list[str]]:
    """`sluice run` on the workload's manifest in pipelines/bench/peers, its topics set to the run's (and its
    sink's `delivery`, if given)."""

    def command(launch: Launch) -> list[str]:
        template = PEERS_DIR / f"{manifest_prefix}{launch.workload.name}.yaml"
        manifest = yaml.safe_load(template.read_text())
        for node in manifest["spec"]["pipeline"]["nodes"]:
            if "fromKafka" in node:
                node["fromKafka"]["topic"] = launch.source
            if "toKafka" in node:
                node["toKafka"]["topic"] = launch.sink
                if delivery is not None:
                    node["toKafka"]["delivery"] = delivery
        app = launch.workdir / template.name
        app.write_text(yaml.safe_dump(manifest, sort_keys=False))
        sluice = [sys.executable, "-m", "sluice.pipelines.cli", "run", str(app)]
        return [
            *sluice,
            "--bootstrap-servers",
            launch.bootstrap,
            "--checkpoint-dir",
            str(launch.workdir / "checkpoint"),
            "--cores",
            str(cores),
        ]

    return command


def _no_args(launch: Launch) -> list[str]:
    return []


def _peer(
    env: PeerEnv, script: str, guarantee: str, extra: Callable[[Launch], list[str]] = _no_args
) -> Callable[[Launch], list[str]]:
    def command(launch: Launch) -> list[str]:
        contract = [*_contract_args(launch), "--guarantee", guarantee]
        return [str(env.python()), str(PEERS_DIR / script), *contract, *extra(launch)]

    return command


def _flink_jar(launch: Launch) -> list[str]:
    return ["--jar", str(maven_jar(*FLINK_CONNECTOR))]


# How often the exactly-once peers commit their output: their visibility latency's floor, and a cost per commit.
# Throughput runs use these; latency runs sweep the INTERVALS and keep the one with the best p99 at half load.
PYFLINK_CHECKPOINT_INTERVAL = os.environ.get("SLUICE_BENCH_PYFLINK_CHECKPOINT_INTERVAL", "1 s")
QUIXSTREAMS_EOS_COMMIT_INTERVAL = os.environ.get("SLUICE_BENCH_QUIXSTREAMS_EOS_COMMIT_INTERVAL", "1")
PYFLINK_INTERVALS = ("250 ms", "500 ms", "1 s", "2 s")
QUIXSTREAMS_INTERVALS = ("0.25", "0.5", "1", "2")  # seconds
# PyFlink's mini-batch aggregation emits its updates once per allow-latency (500 ms in its throughput runs): at
# least once, that is its visibility floor, so its latency runs sweep it too.
PYFLINK_MINI_BATCH_LATENCIES = ("100 ms", "250 ms", "500 ms")


def _flink_at_least_once(launch: Launch) -> list[str]:
    mini_batch = ["--conf", f"table.exec.mini-batch.allow-latency={launch.interval}"] if launch.interval else []
    return [*_flink_jar(launch), *mini_batch]


def _flink_exactly_once(launch: Launch) -> list[str]:
    return [*_flink_jar(launch), "--checkpoint-interval", launch.interval or PYFLINK_CHECKPOINT_INTERVAL]


def _quix_exactly_once(launch: Launch) -> list[str]:
    return ["--commit-interval", launch.interval or QUIXSTREAMS_EOS_COMMIT_INTERVAL]


# Each system at its own best settings for its guarantee. Spark's own Kafka sink and Bytewax's have no
# exactly-once mode; sluice's real-time mode writes at least once.
SYSTEMS = (
    System("sluice", _sluice("sluice-", CORES), EXACTLY_ONCE),  # the default delivery, exactlyOnce
    System(
        "pyflink-eos",
        _peer(PYFLINK, "pyflink_job.py", EXACTLY_ONCE, _flink_exactly_once),
        EXACTLY_ONCE,
        intervals=PYFLINK_INTERVALS,
    ),
    System(
        "quixstreams-eos",
        _peer(QUIXSTREAMS, "quixstreams_job.py", EXACTLY_ONCE, _quix_exactly_once),
        EXACTLY_ONCE,
        slow=True,
        intervals=QUIXSTREAMS_INTERVALS,
    ),
    System("sluice-alo", _sluice("sluice-", CORES, delivery="atLeastOnce"), AT_LEAST_ONCE),
    # Real-time mode holds a task slot per Kafka partition for the whole checkpoint interval: 4 slots for the
    # 4-partition topic, on 2 cores (the tasks mostly wait for records).
    System(
        "sluice-realtime", _sluice("sluice-realtime-", 4), AT_LEAST_ONCE, workloads=frozenset({"filter-projection"})
    ),
    System("hand-written", _hand_written("defaults"), AT_LEAST_ONCE),
    System("hand-tuned", _hand_written("tuned"), AT_LEAST_ONCE),
    System(
        "pyflink",
        _peer(PYFLINK, "pyflink_job.py", AT_LEAST_ONCE, _flink_at_least_once),
        AT_LEAST_ONCE,
        intervals=PYFLINK_MINI_BATCH_LATENCIES,
        sweeps="mini-batches every",
        sweeps_stateless=False,
    ),
    System("quixstreams", _peer(QUIXSTREAMS, "quixstreams_job.py", AT_LEAST_ONCE), AT_LEAST_ONCE, slow=True),
    System("bytewax", _peer(BYTEWAX, "bytewax_job.py", AT_LEAST_ONCE), AT_LEAST_ONCE, slow=True),
)
GUARANTEES = {system.name: system.guarantee for system in SYSTEMS}
LIMIT = "limit"
SYSTEM_NAMES = (LIMIT, *(s.name for s in SYSTEMS))


# ------------------------------------------------------------------------------------------ the input


def input_records(bootstrap: str, topic: str) -> Iterator[list[InputRecord]]:
    """Every record now in the topic, batch by batch: (key, value, producer timestamp)."""
    ends = end_offsets(bootstrap, topic)
    position = dict.fromkeys(ends, 0)
    batches: list[list[InputRecord]] = []

    def keep(batch: list[Message]) -> None:
        records = []
        for msg in batch:
            records.append((msg.key(), msg.value() or b"", msg.timestamp()[1]))
            position[msg.partition()] = msg.offset() + 1
        batches.append(records)

    _drain(bootstrap, topic, keep, lambda: all(position[p] >= ends[p] for p in ends), 900)
    yield from batches


def ready(tokens: Any) -> None:
    """A limit worker's start (its pool's initializer): this module and the Kafka client imported, then said."""
    tokens.put(os.getpid())


def read_partitions(bootstrap: str, topic: str, partitions: list[int]) -> tuple[int, float, float]:
    """The limit: read these partitions of the topic to their end with one raw consumer: how many records, and
    when (epoch s) the reading began, once the consumer was made and assigned, and ended."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"sluice-bench-{time.time_ns()}", **CONSUMER_CONF})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    position = dict.fromkeys(partitions, 0)
    read = 0
    began = time.time()
    try:
        while any(position[p] < ends[p] for p in partitions):
            for msg in consumer.consume(num_messages=100_000, timeout=0.2):
                if msg.error() is not None:
                    raise KafkaException(msg.error())
                position[msg.partition()] = msg.offset() + 1
                read += 1
        ended = time.time()
    finally:
        consumer.close()
    return read, began, ended


def reference_of(workload: Workload, bootstrap: str, topic: str) -> Reference:
    reference = Reference(workload)
    for batch in input_records(bootstrap, topic):
        reference.add(batch)
    return reference


# ------------------------------------------------------------------------------------ the output watch


@dataclass
class Watched:
    complete_at: float | None  # epoch s when the output first equalled the reference
    errors: list[str]
    outputs: int
    arrivals: list[Arrival]


def _watch(bootstrap: str, topic: str, keep_arrivals: bool, references: Any, events: Any, result: Any) -> None:
    """Read the output until told to stop and at its end. Records wait until the reference arrives (a latency
    run knows it only once the producer is done), each with when it was first seen.

    A throughput run of a stateless workload only counts the records while the job runs (what the check costs in
    Python would be taken from the job's 2 cores: about 1 µs a record, 3 s of CPU in a 6M-record run), and checks
    the whole output once the job has stopped."""
    stop, first_output, _ = events
    if keep_arrivals:

        def arrived() -> Reference | None:
            return None if references.empty() else references.get()

        result.put(_checked_read(bootstrap, topic, True, arrived, events))
        return
    reference: Reference = references.get(timeout=60)  # a throughput run knows it before the job starts
    if reference.workload.stateful:  # one record per group and batch: few to check
        result.put(_checked_read(bootstrap, topic, False, lambda: reference, events))
        return
    complete_at = _count_until(bootstrap, topic, reference.expected_outputs, events)
    watched = _checked_read(bootstrap, topic, False, lambda: reference, (stop, first_output, Event()))
    result.put(replace(watched, complete_at=complete_at))


def _count_until(bootstrap: str, topic: str, expected: int, events: Any) -> float | None:
    """Count the committed output records until the job is stopped: epoch s when they first reached `expected`."""
    stop, first_output, done = events
    consumer, _ = _assigned_consumer(bootstrap, topic, {"isolation.level": "read_committed"})
    outputs, complete_at = 0, None
    try:
        while not stop.is_set():
            outputs += sum(1 for _ in records_to_end(_fetched(consumer), set()))
            if outputs and not first_output.is_set():
                first_output.set()
            if complete_at is None and outputs >= expected:
                complete_at = time.time()
                done.set()
    finally:
        consumer.close()
    return complete_at


def _checked_read(
    bootstrap: str, topic: str, keep_arrivals: bool, reference_known: Callable[[], Reference | None], events: Any
) -> Watched:
    """Every output record through the check (once `reference_known` has it), until told to stop and read to the
    end."""
    stop, first_output, done = events
    consumer, partitions = _assigned_consumer(
        bootstrap, topic, {"enable.partition.eof": True, "isolation.level": "read_committed"}
    )
    state: OutputState | None = None
    pending: list[tuple[bytes | None, bytes | None, float]] = []
    first: dict[tuple[Any, int], float] = {}
    complete_at = None
    outputs = 0
    at_end: set[int] = set()
    try:
        while not (stop.is_set() and state is not None and len(at_end) == len(partitions)):
            fetched = _fetched(consumer)
            now_ms = time.time() * 1000  # when the records were here: after the fetch's wait, as the limit stamps
            for msg in records_to_end(fetched, at_end):
                at_end.discard(msg.partition())
                pending.append((msg.key(), msg.value(), now_ms))
            if pending and not first_output.is_set():
                first_output.set()
            if state is None and (reference := reference_known()) is not None:
                state = OutputState(reference)
            if state is not None:
                for key, value, seen_ms in pending:
                    seen = state.add(key, value)
                    if keep_arrivals and seen is not None:
                        first.setdefault(seen, seen_ms)
                outputs += len(pending)
                pending.clear()
                if complete_at is None and state.complete():
                    complete_at = time.time()
                    done.set()
    finally:
        consumer.close()
    assert state is not None
    arrivals = [(group, count, at) for (group, count), at in first.items()]
    return Watched(complete_at, state.errors(), outputs, arrivals)


class OutputWatch:
    """The spawned reader of one run's output topic; hand it the reference when it is known."""

    def __init__(self, bootstrap: str, topic: str, keep_arrivals: bool) -> None:
        context = _spawn()
        self._references, self._result = context.Queue(), context.Queue()
        self._stop, self.first_output, self.done = context.Event(), context.Event(), context.Event()
        self._process = context.Process(
            target=_watch,
            args=(
                bootstrap,
                topic,
                keep_arrivals,
                self._references,
                (self._stop, self.first_output, self.done),
                self._result,
            ),
            daemon=True,
        )
        self._process.start()

    def expect(self, reference: Reference) -> OutputWatch:
        self._references.put(reference)
        return self

    def finish(self, timeout: float = 600) -> Watched:
        self._stop.set()
        try:
            watched = self._result.get(timeout=timeout)
        except queue.Empty:
            code = self._process.exitcode
            raise TimeoutError(f"the output watch gave no result in {timeout:.0f}s (its exit code: {code})") from None
        self._process.join(60)
        return watched


@dataclass
class Running:
    """One system's job, started."""

    system: System
    process: ManagedProcess
    started_at: float  # epoch s

    @classmethod
    def start(cls, system: System, launch: Launch) -> Running:
        launch.workdir.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "pipelines"), str(Path(__file__).parent)])}
        process = ManagedProcess(
            system.name, system.command(launch), launch.workdir / "job.log", env=env, cwd=launch.workdir
        )
        started_at = time.time()
        return cls(system, process.start(), started_at)

    def wait(self, event: Any, timeout: float, what: str) -> None:
        """Until the watch's event is set; fails when the job exits first or the time is up."""
        deadline = time.monotonic() + timeout
        while not event.wait(0.2):
            if not self.process.alive():
                raise RuntimeError(f"{self.system.name} exited: {' | '.join(tail(self.process.log, 8))}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.system.name}: {what} within {timeout:.0f}s; see {self.process.log}")

    def stop(self) -> None:
        self.process.stop(grace=20)


def run_job(system: System, launch: Launch, reference: Reference, timeout: float) -> tuple[float, Watched]:
    """Run a system on a prefilled topic until its output is complete: (seconds from launch, what it wrote)."""
    watch = OutputWatch(launch.bootstrap, launch.sink, keep_arrivals=False).expect(reference)
    job = Running.start(system, launch)
    try:
        job.wait(watch.done, timeout, f"output of {reference.records:,} records not complete")
    finally:
        job.stop()
    watched = checked(system, launch, watch.finish())
    assert watched.complete_at is not None
    return watched.complete_at - job.started_at, watched


def checked(system: System, launch: Launch, watched: Watched) -> Watched:
    """The benchmark fails on a wrong result, never on a slow one."""
    if watched.errors:
        raise AssertionError(f"{system.name} on {launch.workload.name}: wrong output: {'; '.join(watched.errors)}")
    return watched
