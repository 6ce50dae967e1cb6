"""The fault suite: exactly-once Kafka output through crashes, on real Kafka and real Spark.

Workload. A paced producer writes JSON events {word, n, ts} (ts: when produced) to a 3-partition topic;
1% of them are malformed, in five kinds: bad JSON, wrong types, no event time, a number beyond INT, a
256 KB blob. The app counts events and sums n per word in 2 s event-time windows (watermark 5 s, append
mode: each window is written once, when it closes) to Kafka with delivery exactlyOnce; malformed records go
to a dead-letter topic, also exactly once. At the end one event far in the future closes every window.

Check. The output, read as a read_committed consumer reads it, against the reference computed from what
the producer wrote: every (window, word) exactly once with the right count and sum (lost: missing or
wrong; duplicated: written more than once), every malformed record once in the dead letters.

Faults (`make faults` runs the long ones; CI runs the driver case with 2 kills, for either writer):
- the driver (`sluice run`, Spark in local mode) killed with SIGKILL at random moments in its batches and
  started again on its checkpoint;
- an executor of a Spark standalone cluster killed while a task holds an uncommitted transaction, or right
  after the task committed and before it reported back to Spark;
- a broker of a 3-broker cluster stopped and restarted, one after the other (leaders and the transaction
  coordinator move).
Each case prints, and writes to .sluice/faults/<case>.json: runs, kills, records, lost, duplicated, the time
to recover from each fault (`recovery`: the output's longest pause, from the commit log; see RECOVERY), and the
exactly-once sink's write paths it exercised (WRITE_PATHS): `out` (an aggregation) writes from the driver
(`writers: auto`: the driver places the batch and writes each partition's transaction) or from the executors
(`writers: executors`: placed in the streaming plan, shuffled to one task per partition); the dead letters
(stateless, a one-partition topic) are written by the one task that reads the batch, with no shuffle.
"""

from __future__ import annotations

import json
import os
import random
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from confluent_kafka import Producer
from helpers import epoch_ms, iso
from kafka_output import read_committed

from sluice.pipelines.local.kafka import KafkaCluster
from sluice.pipelines.local.kafka_io import create_topic
from sluice.pipelines.local.spark import spark_kafka_jars
from sluice.pipelines.sinks.kafka_eos import Marker
from sluice.testbed.common import REPO_ROOT, stop_process_group, tail
from sluice.testbed.recovery import commit_times, output_pause, pauses_summary
from sluice.testbed.spark_standalone import StandaloneCluster

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

WINDOW_MS = 2_000
WORDS = tuple(f"w{i:02d}" for i in range(40))
MALFORMED_EVERY = 100  # 1%
HOOKS = Path(__file__).parent / "fault_hooks"
REPORTS = REPO_ROOT / ".sluice" / "faults"
WRITE_PATHS = {
    "auto": "out: driver-side placement, the driver writes each partition's transaction",
    "executors": "out: placed in the streaming plan, one executor task per partition writes its transaction",
    "dead letters": "one task reads the batch and writes the one-partition topic (no shuffle)",
}
RECOVERY = {
    "driver": "from the killed driver's restart to its first batch of `out` committed",
    "executor": "from the executor's kill to the next batch of `out` committed (the batch retried)",
    "broker": "the longest time without a batch of `out` committed, from the broker's stop to the first "
    "batch committed after it was back",
}


# ------------------------------------------------------------------------------------- workload


def malformed(seq: int, now_ms: int) -> tuple[str, bytes]:
    """One malformed record, unique by its sequence number, of one of five kinds."""
    kind = ("bad json", "wrong types", "no event time", "number beyond INT", "oversize")[seq % 5]
    return kind, {
        "bad json": f'{{"word": "bad-{seq}", "n": 1, "ts": '.encode(),
        "wrong types": json.dumps({"word": f"types-{seq}", "n": "many", "ts": iso(now_ms)}).encode(),
        "no event time": json.dumps({"word": f"no-ts-{seq}", "n": 1}).encode(),
        "number beyond INT": json.dumps({"word": f"big-{seq}", "n": 2**40, "ts": iso(now_ms)}).encode(),
        "oversize": f"{seq}:".encode() + b"x" * 256_000,
    }[kind]


class PacedEvents(threading.Thread):
    """Writes `rate` events/s until stopped; keeps what it wrote for the reference."""

    def __init__(self, bootstrap: str, topic: str, rate: float, seed: int = 1) -> None:
        super().__init__(name="paced-events", daemon=True)
        self.bootstrap, self.topic, self.rate = bootstrap, topic, rate
        self.rng = random.Random(seed)
        self.good: list[tuple[int, str, int]] = []  # (event time ms, word, n)
        self.bad: list[bytes] = []
        self._stopping = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._produce()
        except BaseException as exc:
            self.error = exc

    def _produce(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "linger.ms": 5,
                "message.max.bytes": 1_000_000,
                "enable.idempotence": True,
            }
        )
        started, sent = time.monotonic(), 0
        while not self._stopping.is_set():
            due = int((time.monotonic() - started) * self.rate)
            while sent < due:
                now_ms = int(time.time() * 1000)
                if sent % MALFORMED_EVERY == MALFORMED_EVERY // 2:
                    value = malformed(sent, now_ms)[1]
                    self.bad.append(value)
                else:
                    word, n = self.rng.choice(WORDS), self.rng.randint(1, 9)
                    value = json.dumps({"word": word, "n": n, "ts": iso(now_ms)}).encode()
                    self.good.append((now_ms, word, n))
                producer.produce(self.topic, value)
                sent += 1
            producer.poll(0)
            time.sleep(0.01)
        if producer.flush(60):
            raise RuntimeError("the paced producer could not deliver everything")

    def finish(self) -> None:
        self._stopping.set()
        self.join(120)
        if self.error is not None:
            raise self.error


@dataclass
class Workload:
    """The app, its topics and its producer, on one Kafka."""

    bootstrap: str
    tmp_path: Path
    replicas: int = 1
    rate: float = 300
    writers: str = "auto"  # the output's (an aggregation: auto writes from the driver)
    topics: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        tag = f"{os.getpid()}-{time.time_ns()}"
        for role, partitions in (("in", 3), ("out", 3), ("dead", 1)):
            self.topics[role] = f"faults-{role}-{tag}"
            create_topic(self.bootstrap, self.topics[role], partitions, replicas=self.replicas)
        self.checkpoint = self.tmp_path / "checkpoint"
        self.manifest = self.tmp_path / "app.yaml"
        self.manifest.write_text(yaml.safe_dump(self.app()))
        self.events = PacedEvents(self.bootstrap, self.topics["in"], self.rate)

    def app(self) -> dict[str, Any]:
        return {
            "apiVersion": "sluice.dev/v1alpha1",
            "kind": "StreamingApp",
            "metadata": {"name": "faults"},
            "spec": {
                "pipeline": {
                    "trigger": {"processingTime": "1s"},
                    "nodes": [
                        {
                            "name": "events",
                            "fromKafka": {
                                "topic": self.topics["in"],
                                "format": "json",
                                "schema": "word STRING, n INT, ts TIMESTAMP",
                                "eventTime": "ts",
                                "watermark": "5s",
                            },
                        },
                        {
                            "name": "counts",
                            "inputs": ["events"],
                            "aggregate": {
                                "groupBy": ["word"],
                                "window": {"tumbling": f"{WINDOW_MS}ms"},
                                "aggregations": {"count": "count(*)", "total": "sum(n)"},
                            },
                        },
                        {
                            "name": "out",
                            "inputs": ["counts"],
                            "toKafka": {
                                "topic": self.topics["out"],
                                "key": "word",
                                "delivery": "exactlyOnce",
                                "writers": self.writers,
                            },
                        },
                    ],
                    "deadLetter": {"toKafka": {"topic": self.topics["dead"], "delivery": "exactlyOnce"}},
                }
            },
        }

    def close_every_window(self) -> None:
        """One event far ahead: the watermark passes every window of the data (this event's stays open)."""
        far = int(time.time() * 1000) + 3_600_000
        producer = Producer({"bootstrap.servers": self.bootstrap})
        producer.produce(self.topics["in"], json.dumps({"word": "flush", "n": 0, "ts": iso(far)}).encode())
        producer.flush(30)

    def expected(self) -> dict[tuple[int, str], tuple[int, int]]:
        windows: dict[tuple[int, str], tuple[int, int]] = {}
        for ms, word, n in self.events.good:
            key = (ms - ms % WINDOW_MS, word)
            count, total = windows.get(key, (0, 0))
            windows[key] = (count + 1, total + n)
        return windows

    def written(self) -> Counter[tuple[int, str, int, int]]:
        out = Counter()
        for record in read_committed(self.bootstrap, self.topics["out"]):
            row = json.loads(record.value or b"")
            out[(epoch_ms(row["window_start"]), row["word"], row["count"], row["total"])] += 1
        return out

    def dead_letters(self) -> Counter[bytes]:
        return Counter(r.value or b"" for r in read_committed(self.bootstrap, self.topics["dead"]))

    def complete(self) -> bool:
        return len(self.written()) >= len(self.expected()) and sum(self.dead_letters().values()) >= len(self.events.bad)


# --------------------------------------------------------------------------------------- checking


@dataclass
class FaultReport:
    fault: str
    runs: int = 0
    kills: int = 0
    records: int = 0
    windows: int = 0
    lost: int = 0
    duplicated: int = 0
    dead_letters: int = 0
    dead_letters_lost: int = 0
    dead_letters_duplicated: int = 0
    recovery: dict[str, Any] = field(default_factory=dict)
    notes: dict[str, Any] = field(default_factory=dict)

    def recovered(self, workload: Workload, kind: str, faults: list[tuple[float, float]]) -> None:
        """The output's pause after each fault (start, end), read from `out`'s commit log."""
        commits = commit_times(workload.checkpoint / "out" / "commits")
        pauses = [output_pause(commits, start, end) for start, end in faults]
        self.recovery = {"measured": RECOVERY[kind], **pauses_summary(pauses)}

    def check(self, workload: Workload) -> None:
        self.notes["write paths"] = [WRITE_PATHS[workload.writers], WRITE_PATHS["dead letters"]]
        expected = workload.expected()
        written = workload.written()
        by_window = Counter((window, word) for window, word, _, _ in written.elements())
        right = {
            (window, word) for window, word, count, total in written if expected.get((window, word)) == (count, total)
        }
        self.records = len(workload.events.good) + len(workload.events.bad)
        self.windows = len(expected)
        self.lost = len(set(expected) - right)
        self.duplicated = sum(n - 1 for n in by_window.values() if n > 1)
        dead = workload.dead_letters()
        self.dead_letters = len(workload.events.bad)
        self.dead_letters_lost = len(set(workload.events.bad) - set(dead))
        self.dead_letters_duplicated = sum(n - 1 for n in dead.values() if n > 1)
        self.write()
        assert self.windows > 0 and self.dead_letters > 0
        assert (self.lost, self.duplicated) == (0, 0), f"output: {self.lost} lost, {self.duplicated} duplicated"
        assert set(by_window) <= set(expected), "windows nobody wrote events for"
        assert (self.dead_letters_lost, self.dead_letters_duplicated) == (0, 0), "dead letters"
        assert not self.recovery.get("never_recovered"), f"output never advanced after a fault: {self.recovery}"

    def write(self) -> None:
        print(
            f"\n{self.fault}: runs {self.runs}, kills {self.kills}, records {self.records:,}, windows "
            f"{self.windows:,}, lost {self.lost}, duplicated {self.duplicated}; dead letters {self.dead_letters}, "
            f"lost {self.dead_letters_lost}, duplicated {self.dead_letters_duplicated}; recovery {self.recovery}; "
            f"{self.notes}"
        )
        REPORTS.mkdir(parents=True, exist_ok=True)
        (REPORTS / f"{self.fault}.json").write_text(json.dumps(asdict(self), indent=2) + "\n")


def batches(log: Path) -> int:
    """The last batch id in a query's offset or commit log; -1 for none."""
    return max((int(f.name) for f in log.iterdir() if f.name.isdigit()), default=-1) if log.is_dir() else -1


def wait(
    condition: Callable[[], bool],
    timeout: float,
    what: str,
    alive: Callable[[], None] = lambda: None,
    interval: float = 0.2,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        alive()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


# ----------------------------------------------------------------------------------------- drivers


class Driver:
    """One driver process after another on the same checkpoint; each restarted when it dies or is killed."""

    def __init__(self, command: list[str], workload: Workload, env: dict[str, str] | None = None) -> None:
        self.command, self.workload = command, workload
        self.env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc: subprocess.Popen[bytes] | None = None
        self.runs = 0

    @property
    def log(self) -> Path:
        return self.workload.tmp_path / f"driver-{self.runs}.log"

    def start(self) -> None:
        self.runs += 1
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                self.command, stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )

    def ensure_running(self) -> None:
        """Restart a driver that exited (a query failed on a fault); it resumes from its checkpoint."""
        if self.proc is not None and self.proc.poll() is not None:
            print(f"driver run {self.runs} exited with {self.proc.returncode}: " + " | ".join(tail(self.log, 3)))
            self.start()

    def kill(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            stop_process_group(self.proc.pid, grace=60)

    def finish(self, timeout: float = 300) -> None:
        """Close every window, wait until the output is complete (or time out: then the check says what is
        missing), stop."""
        self.workload.close_every_window()
        try:
            wait(self.workload.complete, timeout, "the complete output", self.ensure_running, interval=2)
        except AssertionError as exc:
            print(exc)
        time.sleep(3)  # anything written twice would come now
        self.stop()


def sluice_run(workload: Workload) -> Driver:
    return Driver(
        [
            sys.executable,
            "-m",
            "sluice.pipelines.cli",
            "run",
            str(workload.manifest),
            "--bootstrap-servers",
            workload.bootstrap,
            "--checkpoint-dir",
            str(workload.checkpoint),
            "--cores",
            "2",
        ],
        workload,
    )


@dataclass
class KillMoment:
    """Where in its work a killed driver was, per query: the batch it had started but not completed."""

    in_batch: dict[str, int]
    output_committed: dict[str, list[int]]  # query -> partitions holding that batch's commit already


def kill_moment(workload: Workload) -> KillMoment:
    in_batch, committed = {}, {}
    for query, topic in (("out", "out"), ("events-dead-letters", "dead")):
        started, done = (batches(workload.checkpoint / query / log) for log in ("offsets", "commits"))
        if started > done:
            in_batch[query] = started
            markers = [
                (r.partition, Marker.of(r.headers)) for r in read_committed(workload.bootstrap, workload.topics[topic])
            ]
            committed[query] = sorted({p for p, m in markers if m is not None and m.batch_id == started})
    return KillMoment(in_batch, committed)


def kill_driver_repeatedly(driver: Driver, kills: int, rng: random.Random) -> tuple[list[KillMoment], list[float]]:
    """Start the driver and kill it with SIGKILL at a random moment of a batch, `kills` times, restarting it each
    time; where each kill landed, and when each restart began."""
    moments, restarts = [], []
    out_offsets = driver.workload.checkpoint / "out" / "offsets"
    driver.start()
    for _ in range(kills):
        first = batches(out_offsets)
        wait(
            lambda first=first: batches(out_offsets) > first + 1,
            300,
            "the driver to run batches",
            driver.ensure_running,
        )
        started = batches(out_offsets)
        wait(lambda started=started: batches(out_offsets) > started, 60, "a batch to start", driver.ensure_running)
        time.sleep(rng.uniform(0, 1.2))
        driver.kill()
        moments.append(kill_moment(driver.workload))
        restarts.append(time.time())
        driver.start()
    return moments, restarts


# ------------------------------------------------------------------------------------------ faults


@pytest.mark.parametrize(
    ("kills", "writers"),
    [
        pytest.param(2, "auto", id="ci"),
        pytest.param(2, "executors", id="ci-executor-writes"),
        pytest.param(20, "auto", id="long-driver-writes", marks=pytest.mark.faults),
        pytest.param(20, "executors", id="long-executor-writes", marks=pytest.mark.faults),
    ],
)
@pytest.mark.timeout(3600)
def test_driver_killed(kafka_bootstrap: str, tmp_path: Path, kills: int, writers: str) -> None:
    """`sluice run` killed with SIGKILL mid-batch and restarted on its checkpoint: 0 lost, 0 duplicated, with
    the output written from the driver or from the executors."""
    workload = Workload(kafka_bootstrap, tmp_path, writers=writers)
    driver = sluice_run(workload)
    workload.events.start()
    try:
        moments, restarts = kill_driver_repeatedly(driver, kills, random.Random(kills))
        workload.events.finish()
        driver.finish()
    finally:
        workload.events.finish()
        driver.stop()
    report = FaultReport(f"driver-sigkill-{kills}-{writers}", runs=driver.runs, kills=kills)
    report.notes = {
        "kills in a batch": sum(1 for m in moments if m.in_batch),
        "kills after the batch's output was committed to some partitions": sum(
            1 for m in moments if any(m.output_committed.values())
        ),
    }
    report.recovered(workload, "driver", [(restart, restart) for restart in restarts])
    report.check(workload)


@pytest.mark.faults
def test_malformed_records_only(kafka_bootstrap: str, tmp_path: Path) -> None:
    """1% malformed records and no other fault: all in the dead letters, the rest exact (CI checks them in
    the driver case)."""
    workload = Workload(kafka_bootstrap, tmp_path, rate=1000)
    driver = sluice_run(workload)
    workload.events.start()
    try:
        driver.start()
        time.sleep(90)
        workload.events.finish()
        driver.finish()
    finally:
        workload.events.finish()
        driver.stop()
    FaultReport("malformed-1pct", runs=driver.runs).check(workload)


# ---------------------------------------------------------------------------------- executor killed


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path / "spark-standalone", worker_cores=2, worker_memory="2g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def submit_args(master: str, fault_dir: Path) -> str:
    """spark-submit's arguments: two one-core executors whose Python workers load the fault hooks."""
    conf = {
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "768m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.executorEnv.PYTHONPATH": str(HOOKS),
        "spark.executorEnv.SLUICE_FAULT_DIR": str(fault_dir),
    }
    args = ["--master", master, "--driver-memory", "1g", "--jars", ",".join(map(str, spark_kafka_jars()))]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return shlex.join([*args, "pyspark-shell"])


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def kill_executor_in_commit(driver: Driver, fault_dir: Path, phase: str) -> float:
    """Ask the next commit to pause in `phase`, then SIGKILL the executor running it (its JVM; its Python
    workers go with it); when it was killed."""
    (fault_dir / phase).touch()
    paused = fault_dir / "paused"
    wait(paused.exists, 300, f"a task to pause {phase}", driver.ensure_running)
    worker = json.loads(paused.read_text())["pid"]
    executor = parent(parent(worker))  # worker <- pyspark.daemon <- executor JVM
    assert b"CoarseGrainedExecutorBackend" in Path(f"/proc/{executor}/cmdline").read_bytes()
    os.kill(executor, signal.SIGKILL)
    killed = time.time()
    paused.unlink()
    return killed


@pytest.mark.faults
@pytest.mark.timeout(3600)
def test_executor_killed_in_a_commit(kafka_bootstrap: str, tmp_path: Path, standalone: StandaloneCluster) -> None:
    """Executors of a standalone cluster killed with SIGKILL while a task's transaction is open (the retry
    fences and aborts it) and right after a task committed (the retry finds the batch there): 0 lost, 0
    duplicated."""
    workload = Workload(kafka_bootstrap, tmp_path, writers="executors")  # the transactions in executors
    fault_dir = tmp_path / "faults"
    fault_dir.mkdir()
    driver = Driver(
        [
            sys.executable,
            "-m",
            "sluice.pipelines.runner",
            str(workload.manifest),
            "--bootstrap-servers",
            workload.bootstrap,
            "--checkpoint-dir",
            str(workload.checkpoint),
            "--control-port",
            "0",
        ],
        workload,
        env={"PYSPARK_SUBMIT_ARGS": submit_args(standalone.master_url, fault_dir)},
    )
    phases = ["before-commit", "after-commit"] * 3
    kills = []
    workload.events.start()
    try:
        driver.start()
        for phase in phases:
            kills.append(kill_executor_in_commit(driver, fault_dir, phase))
        workload.events.finish()
        driver.finish()
    finally:
        workload.events.finish()
        driver.stop()
    report = FaultReport("executor-killed-in-commit", runs=driver.runs, kills=len(phases))
    report.notes = {"phases": dict(Counter(phases))}
    report.recovered(workload, "executor", [(killed, killed) for killed in kills])
    report.check(workload)


# ------------------------------------------------------------------------------------- broker restarted


@pytest.fixture
def three_brokers(tmp_path: Path) -> Iterator[KafkaCluster]:
    cluster = KafkaCluster.on_free_ports(tmp_path / "kafka3", size=3)
    cluster.heap = "384m"
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.mark.faults
@pytest.mark.timeout(3600)
@pytest.mark.parametrize("writers", ["auto", "executors"])
def test_broker_stopped_and_restarted(three_brokers: KafkaCluster, tmp_path: Path, writers: str) -> None:
    """Each broker of a 3-broker cluster stopped and restarted in turn while the app runs: 0 lost, 0 duplicated,
    with the output written from the driver or from the executors."""
    workload = Workload(three_brokers.bootstrap, tmp_path, replicas=3, writers=writers)
    driver = sluice_run(workload)
    out_commits = workload.checkpoint / "out" / "commits"
    outages = []
    workload.events.start()
    try:
        driver.start()
        for process in three_brokers.processes:
            done = batches(out_commits)
            wait(lambda done=done: batches(out_commits) > done + 3, 300, "batches", driver.ensure_running)
            stopped = time.time()
            process.stop()
            time.sleep(15)
            process.start()
            three_brokers.wait_ready(120)
            outages.append((stopped, time.time()))
        workload.events.finish()
        driver.finish()
    finally:
        workload.events.finish()
        driver.stop()
    report = FaultReport(f"broker-restarted-{writers}", runs=driver.runs, kills=len(three_brokers.processes))
    report.recovered(workload, "broker", outages)
    report.check(workload)
