"""`make soak`: the word count on the local cluster for SLUICE_SOAK_MINUTES under a paced load that rises and
falls like a day (compressed), its executors autoscaled, a hot swap, a checkpoint migration and a driver pod
deleted every so often, and beside it a stream-stream join (requests matched to their responses) under the same
day's load; sampled each minute. At the end every word must be counted exactly once and every request matched
exactly once.

What is sampled (each series a list of (minute, value); the names say the unit):
- the pods' cgroup memory (memory.current) and anonymous memory (memory.stat's anon: the RSS that is not page
  cache): the driver's, the largest executor's, the operator's;
- per process (from /proc): the driver JVM's, the Python runner's and the executor JVM's RSS, threads and open
  files;
- the driver JVM's own figures from the runner's metrics (sluice_jvm_*): heap and non-heap used, direct buffers,
  and Native Memory Tracking's committed total and categories (the soak app runs with NMT on);
- the checkpoint's size on the object store: Spark's logs (offsets, commits, metadata, sources), state files,
  sluice's side files;
- the Kafka transactional ids the brokers know and how many transactions are open (kafka-transactions' list);
- the backlog and the number of executors;
- the join's driver (`join_` series): its pod's memory, its JVM's RSS and threads, its checkpoint on the store.
The results go to .sluice/soak/: series.json, summary.json (shape below), soak.png (every series).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import statistics
import subprocess
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .common import REPO_ROOT, cache_dir, minutes_from_env
from .e2e_suite import (
    COUNTS,
    LINES,
    E2ESuite,
    HostKafka,
    PacedLoad,
    SecuredHostKafka,
    driver_get,
    duplicated_windows,
    word_counts,
)

SOAK_DIR = REPO_ROOT / ".sluice" / "soak"
MINUTES_ENV = "SLUICE_SOAK_MINUTES"
DEFAULT_MINUTES = 180.0
NMT_OPTION = "-XX:NativeMemoryTracking=summary"
WORDS = ("ant", "bee", "cat", "dog", "eel", "fox", "gnu", "hen")
JOIN_APP, REQUESTS, RESPONSES, MATCHED = "soak-join", "soak-requests", "soak-responses", "soak-matched"
JOIN_SHARE = 0.3  # the join's request/response pairs per second, as a share of the word count's records
FIRMS = ("acme", "globex", "initech", "umbrella")

Series = list[tuple[float, float]]  # (minute, value)


@dataclass(frozen=True)
class SoakPlan:
    """How long, how much load and how often each disturbance comes (minutes)."""

    minutes: float
    base_rate: float = 30.0  # records/s at the day's mean
    swing: float = 0.6  # the day's load goes from (1 - swing) to (1 + swing) times the mean
    day_minutes: float = 60.0
    hot_swap_every: float = 25.0
    migration_every: float = 50.0
    driver_kill_every: float = 95.0  # a driver lives over an hour past its warm-up: long enough to judge its growth
    quiet_end: float = 10.0  # no disturbance in the last minutes: the end check reads a settled app
    warmup_minutes: float = 30.0  # the first soak's driver heap reached -Xmx after ~27 minutes

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> SoakPlan:
        return cls(minutes_from_env(MINUTES_ENV, DEFAULT_MINUTES, 5, environ))

    @property
    def warmup(self) -> float:
        """Minutes left out of growth figures: the JVM's heap, code cache and state stores fill up first."""
        return min(self.warmup_minutes, self.minutes / 4)

    def rate_at(self, minute: float) -> float:
        """The load at `minute`: a day's sine, lowest at its start (night), highest at its middle."""
        return self.base_rate * (1 - self.swing * math.cos(2 * math.pi * minute / self.day_minutes))

    def events(self) -> list[tuple[float, str]]:
        """(minute, what) of every disturbance, in order, at least 5 minutes apart, none in the quiet end."""
        wanted = sorted(
            (k * every, kind)
            for kind, every in (
                ("hot_swap", self.hot_swap_every),
                ("migration", self.migration_every),
                ("driver_kill", self.driver_kill_every),
            )
            for k in range(1, int(self.minutes // every) + 1)
        )
        placed: list[tuple[float, str]] = []
        for minute, kind in wanted:
            at = max(minute, placed[-1][0] + 5) if placed else minute
            if at <= self.minutes - self.quiet_end:
                placed.append((at, kind))
        return placed


SETTLED_MINUTES = 15.0  # a rise is read between the medians of a window's first and last quarter-hour


def growth_pct_per_hour(series: Series, after: float) -> float | None:
    """The series' slope after minute `after`, per hour, in percent of its median there; None with fewer than 3
    points or a zero median. The slope is Theil-Sen's (the median of every pair's slope): a burst (threads
    while a rollout runs, a file while a checkpoint compacts) moves it no more than one point does, where it
    tilts a least-squares fit when it falls near either end."""
    points = [(m, v) for m, v in series if m >= after]
    middle = statistics.median(v for _, v in points) if len(points) >= 3 else 0
    if not middle:
        return None
    slopes = [(v2 - v1) / (m2 - m1) for i, (m1, v1) in enumerate(points) for m2, v2 in points[i + 1 :] if m2 != m1]
    if not slopes:
        return None
    return round(statistics.median(slopes) * 60 / middle * 100, 2)


def settled_rise(series: Series, minutes: float = SETTLED_MINUTES) -> float:
    """From the median of the series' first `minutes` to that of its last: how much it rose, bursts left out."""
    start, end = series[0][0], series[-1][0]
    first = [v for m, v in series if m < start + minutes]
    last = [v for m, v in series if m > end - minutes]
    return float(statistics.median(last) - statistics.median(first))


def unit_of(name: str) -> str:
    for suffix, unit in (("_bytes", "bytes"), ("_threads", "threads"), ("_files", "files"), ("_records", "records")):
        if name.endswith(suffix):
            return unit
    return "count"


GROWTH_BOUND_PCT_PER_HOUR = 5.0  # "no series grows more than a few percent an hour"
JUDGED_MINUTES = 60.0  # a shorter window's fitted slope is mostly the day's load and the GC's sawtooth
COUNT_RISE = 4  # threads or open files: a rise of fewer is one more worker or socket, not a leak
# What a long-lived process holds (its anonymous memory and RSS, threads, open files) and the checkpoint's logs and
# files. Not judged: a pod's memory.current (it counts reclaimable page cache), executors (the autoscaler replaces
# them, so each one's warm-up lands inside the window), JVM pools and NMT categories (parts of the RSS, which is
# judged), state stores and the backlog (they follow the load), sluice's side files and Kafka's counts (a few bytes
# or units: a percentage of them is noise).
GROWTH_JUDGED = re.compile(
    r"((join_)?driver|operator)_\w*(rss_bytes|pod_anon_bytes|threads|open_files)"
    r"|driver_jvm_native_memory_total_bytes|(join_)?checkpoint_(logs_bytes|files)"
)
PER_DRIVER = ("driver_", "executor_")  # series of pods that a driver kill replaces: read per driver's lifetime


def longest_driver(drivers: Sequence[tuple[float, str]], end: float) -> tuple[float, float] | None:
    """(first minute, last minute) of the driver that lived longest, from (minute first seen, pod uid) samples."""
    starts = [minute for index, (minute, uid) in enumerate(drivers) if index == 0 or drivers[index - 1][1] != uid]
    if not starts:
        return None
    return max(zip(starts, [*starts[1:], end], strict=True), key=lambda span: span[1] - span[0])


def summarize(
    series: dict[str, Series],
    plan: SoakPlan,
    minutes: float,
    records: int,
    lost: int,
    duplicated: int,
    drivers: Sequence[tuple[float, str]] = (),
) -> dict[str, Any]:
    """summary.json: {"minutes", "records", "lost", "duplicated", "series": {NAME: {"unit", "after_warmup", "end",
    "growth_pct_per_hour"}}}; after_warmup is the first value at or after the warm-up, end the last. A driver or
    executor series is read over the driver that lived longest (a killed driver's successor warms up again):
    from its start plus the warm-up to its end (`window`)."""
    span = longest_driver(drivers, minutes)
    out: dict[str, Any] = {}
    for name, points in sorted(series.items()):
        begin, until = (
            (span[0] + plan.warmup, span[1]) if span and name.startswith(PER_DRIVER) else (plan.warmup, minutes)
        )
        last = until >= minutes  # the run's end closes the span; a next driver's first sample is not this one's
        window = [(m, v) for m, v in points if begin <= m and (m <= until if last else m < until)]
        if not window:
            continue
        out[name] = {
            "unit": unit_of(name),
            "after_warmup": window[0][1],
            "end": window[-1][1],
            "growth_pct_per_hour": growth_pct_per_hour(window, begin),
            "rise": settled_rise(window),
            "window": [round(begin, 1), round(until, 1)],
        }
    return {
        "minutes": round(minutes, 1),
        "records": records,
        "lost": lost,
        "duplicated": duplicated,
        "warmup_minutes": plan.warmup,
        "drivers": len({uid for _, uid in drivers}),
        "series": out,
        "growth": growth_verdict(out),
    }


def growth_verdict(series: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Which summarized series the growth bound applies to, judged over windows of at least JUDGED_MINUTES:
    {"bound_pct_per_hour", "judged": {NAME: growth}, "too_short": [NAME...], "beyond": {NAME: growth}}. Threads and
    open files are beyond only when they also rose by COUNT_RISE or more (from the median of the window's first
    quarter-hour to that of its last)."""
    bounded = {name: figures for name, figures in series.items() if GROWTH_JUDGED.fullmatch(name)}
    judged = {
        name: figures["growth_pct_per_hour"]
        for name, figures in bounded.items()
        if figures["window"][1] - figures["window"][0] >= JUDGED_MINUTES and figures["growth_pct_per_hour"] is not None
    }
    return {
        "bound_pct_per_hour": GROWTH_BOUND_PCT_PER_HOUR,
        "judged": judged,
        "too_short": sorted(set(bounded) - set(judged)),
        "beyond": {
            name: growth
            for name, growth in judged.items()
            if growth > GROWTH_BOUND_PCT_PER_HOUR
            and (series[name]["unit"] not in ("threads", "files") or rise(series[name]) >= COUNT_RISE)
        },
    }


def rise(figures: dict[str, Any]) -> float:
    return float(figures.get("rise", figures["end"] - figures["after_warmup"]))


# -- what a pod's processes use, from inside it (any image with sh and awk)

POD_FIGURES = r"""
current=$(cat /sys/fs/cgroup/memory.current 2>/dev/null || cat /sys/fs/cgroup/memory/memory.usage_in_bytes)
anon=$(awk '$1=="anon"||$1=="total_rss"{print $2; exit}' /sys/fs/cgroup/memory.stat 2>/dev/null \
  || awk '$1=="total_rss"{print $2}' /sys/fs/cgroup/memory/memory.stat)
echo "cgroup $current $anon"
for d in /proc/[0-9]*; do
  [ -r "$d/status" ] || continue
  cmd=$(tr '\0' ' ' < "$d/cmdline" 2>/dev/null | cut -c1-300)
  [ -n "$cmd" ] || continue
  rss=$(awk '/^VmRSS/{print $2}' "$d/status"); threads=$(awk '/^Threads/{print $2}' "$d/status")
  files=$(ls "$d/fd" 2>/dev/null | wc -l)
  echo "proc ${rss:-0} ${threads:-0} $files $cmd"
done
"""


@dataclass(frozen=True)
class Process:
    role: str  # jvm, runner, python-worker, other
    rss_bytes: int
    threads: int
    files: int


@dataclass(frozen=True)
class PodFigures:
    memory_bytes: int
    anon_bytes: int
    processes: list[Process] = field(default_factory=list)

    def of(self, role: str) -> list[Process]:
        return [p for p in self.processes if p.role == role]


def process_role(command: str) -> str:
    if re.match(r"\S*java\s", command):
        return "jvm"
    if "pyspark.daemon" in command or "pyspark.worker" in command:
        return "python-worker"
    if re.match(r"\S*python\S*\s", command):
        return "runner"
    return "other"


def pod_figures(text: str) -> PodFigures:
    """POD_FIGURES' output read."""
    memory = anon = 0
    processes = []
    for line in text.splitlines():
        parts = line.split(maxsplit=4)
        if parts[:1] == ["cgroup"] and len(parts) >= 3:
            memory, anon = int(parts[1]), int(parts[2])
        elif parts[:1] == ["proc"] and len(parts) == 5:
            processes.append(Process(process_role(parts[4]), int(parts[1]) * 1024, int(parts[2]), int(parts[3])))
    return PodFigures(memory, anon, processes)


def read_pod(target: Any, namespace: str, pod: str) -> PodFigures:
    """What a pod's cgroup and processes use now (POD_FIGURES run in it)."""
    return pod_figures(target.kubectl("exec", "-n", namespace, pod, "--", "sh", "-c", POD_FIGURES).stdout)


def checkpoint_kind(relative: str) -> str:
    """Which part of an app's checkpoint folder a file is: Spark's logs, state, or sluice's side files."""
    parts = relative.split("/")
    if len(parts) > 1 and parts[1] == "state":
        return "state"
    if len(parts) > 1 and parts[1] == "sluice":
        return "sluice"
    return "logs"


def metric_values(text: str, names: Iterable[str]) -> dict[str, float]:
    """`name{labels}` → value of the Prometheus text for the metrics named."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in wanted:
            continue
        for sample in family.samples:
            labels = ",".join(f"{v}" for _, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


def series_name(metric: str) -> str:
    """`sluice_jvm_memory_bytes{heap,used}` → `driver_jvm_heap_used_bytes`; the JVM's own thread count is
    `driver_jvm_live_threads` (`driver_jvm_threads` is the process's, from /proc)."""
    if metric == "sluice_jvm_threads":
        return "driver_jvm_live_threads"
    match = re.fullmatch(r"sluice_jvm_(\w+?)(_bytes)?(?:\{(.*)\})?", metric)
    assert match, metric
    labels = re.sub(r"[^a-z0-9]+", "_", (match[3] or "").lower()).strip("_")
    base = match[1] if match[1] != "memory" else ""
    return "_".join(p for p in ("driver_jvm", base, labels) if p) + (match[2] or "")


# -- the stream-stream join beside the word count


def join_app(suite: E2ESuite) -> dict[str, Any]:
    """Requests matched to their responses (an event-time stream-stream join, 1 s apart at most), each match
    written out: every request comes out once. Its checkpoint goes where the operator's default puts it."""
    conf = {
        "spark.kubernetes.driver.request.cores": "250m",
        "spark.kubernetes.executor.request.cores": "250m",
        "spark.driver.extraJavaOptions": NMT_OPTION,
    }
    source = {"format": "json", "eventTime": "ts", "watermark": "5s"}
    return {
        "apiVersion": "sluice.dev/v1alpha1",
        "kind": "StreamingApp",
        "metadata": {"name": JOIN_APP, "namespace": suite.apps_namespace},
        "spec": {
            "kafka": suite.kafka.app_kafka(),
            "topics": [{"name": topic, "partitions": 4} for topic in (REQUESTS, RESPONSES, MATCHED)],
            "executors": {"instances": 1},
            "spark": {
                "image": suite.images.spark,
                "driver": {"cores": 1, "memory": "512m"},
                "executor": {"cores": 1, "memory": "512m"},
                "sparkConf": conf,
            },
            "pipeline": {
                "nodes": [
                    {
                        "name": "requests",
                        "fromKafka": {"topic": REQUESTS, "schema": "id STRING, firm STRING, ts TIMESTAMP", **source},
                    },
                    {
                        "name": "responses",
                        "fromKafka": {"topic": RESPONSES, "schema": "id STRING, ts TIMESTAMP", **source},
                    },
                    {
                        "name": "matched",
                        "inputs": ["requests", "responses"],
                        "join": {
                            "condition": "requests.id = responses.id",
                            "within": "1s",
                            "select": [
                                "requests.id AS id",
                                "requests.firm AS firm",
                                "unix_millis(responses.ts) - unix_millis(requests.ts) AS latency_ms",
                            ],
                        },
                    },
                    {"name": "out", "inputs": ["matched"], "toKafka": {"topic": MATCHED, "key": "id"}},
                ]
            },
        },
    }


class PairedLoad(PacedLoad):
    """Requests and their responses (0-500 ms later in event time) at a set rate of pairs/s; `sent` counts the
    request ids."""

    def __init__(self, kafka: Any) -> None:
        super().__init__(kafka, REQUESTS)
        self.pairs = 0

    def burst(self, count: int) -> None:
        import datetime as dt
        import random

        now = dt.datetime.now(dt.UTC)
        ids = [f"r{self.pairs + i}" for i in range(count)]
        self.pairs += count

        def at(moment: dt.datetime) -> str:
            return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")

        requests = [json.dumps({"id": i, "firm": FIRMS[hash(i) % len(FIRMS)], "ts": at(now)}) for i in ids]
        responses = [
            json.dumps({"id": i, "ts": at(now + dt.timedelta(milliseconds=random.randint(0, 500)))}) for i in ids
        ]
        self.kafka.produce(REQUESTS, requests)
        self.kafka.produce(RESPONSES, responses)
        self.sent.update(ids)


def matched_copies(kafka: Any) -> Counter[str]:
    """How often each request id came out of the join."""
    return Counter(json.loads(value)["id"] for value in kafka.consume(MATCHED))


# -- the run


@dataclass
class Soak:
    suite: E2ESuite
    plan: SoakPlan
    clock: Callable[[], float] = time.monotonic
    series: dict[str, Series] = field(default_factory=lambda: defaultdict(list))
    events: list[dict[str, Any]] = field(default_factory=list)
    drivers: list[tuple[float, str]] = field(default_factory=list)  # (minute, driver pod uid) of each sample
    swaps: int = 0

    def run(self) -> dict[str, Any]:
        """The soak, then the summary; the word count must be deployed (E2ESuite's deploy_app), the join is
        deployed here."""
        from .common import wait_for

        self.suite.target.apply(join_app(self.suite))
        wait_for(
            lambda: self.suite.app_status(JOIN_APP).get("phase") == "Running",
            timeout=self.suite.timeout,
            what=f"{JOIN_APP} running",
        )
        started = self.clock()
        load = PacedLoad(self.suite.kafka, LINES, words=WORDS).start(rate=self.plan.rate_at(0))
        pairs = PairedLoad(self.suite.kafka).start(rate=JOIN_SHARE * self.plan.rate_at(0))
        pending = self.plan.events()
        next_sample = 0.0
        try:
            while (minute := (self.clock() - started) / 60) < self.plan.minutes:
                load.rate = self.plan.rate_at(minute)
                pairs.rate = JOIN_SHARE * load.rate
                if minute >= next_sample:
                    self.sample(minute)
                    next_sample = math.floor(minute) + 1  # after a long disturbance: no burst of samples
                if pending and minute >= pending[0][0]:
                    _, kind = pending.pop(0)
                    self.disturb(kind, minute)
                time.sleep(2)
        finally:
            sent, requests = load.stop(), pairs.stop()
        ended = (self.clock() - started) / 60  # the last sample's minute: the end check's wait is not a driver's life
        self.sample(ended)
        counted, duplicated_windows = self.settled_counts(sent)
        lost = sum(max(0, n - counted.get(w, 0)) for w, n in sent.items())
        duplicated = sum(max(0, counted.get(w, 0) - n) for w, n in sent.items())  # records counted twice
        matched = self.settled_matches(requests)
        apps = {
            "wordcount": {"records": sent.total(), "lost": lost, "duplicated": duplicated},
            "join": {
                "records": requests.total(),
                "lost": (requests - matched).total(),
                "duplicated": (matched - requests).total(),
            },
        }
        total = {key: sum(app[key] for app in apps.values()) for key in ("records", "lost", "duplicated")}
        summary = summarize(
            self.series,
            self.plan,
            ended,
            total["records"],
            total["lost"],
            total["duplicated"],
            self.drivers,
        )
        return summary | {"apps": apps, "duplicated_windows": duplicated_windows, "events": self.events}

    def settled_matches(self, requests: Counter[str]) -> Counter[str]:
        """The join's output once every request sent came out (or the deadline passed: the rest is lost)."""
        deadline = self.clock() + self.suite.timeout
        while True:
            matched = matched_copies(self.suite.kafka)
            if not (requests - matched) or self.clock() >= deadline:
                return matched
            time.sleep(5)

    def settled_counts(self, sent: Counter[str]) -> tuple[Counter[str], int]:
        """The totals once every window of the last words is out (a flush line now and then), and how many
        window results came twice."""
        deadline = self.clock() + self.suite.timeout
        while True:  # what is still missing at the deadline is reported as lost
            self.suite.kafka.produce(LINES, ["flush"])
            records = self.suite.kafka.consume(COUNTS)
            got = word_counts(records)
            if all(got[w] >= n for w, n in sent.items()) or self.clock() >= deadline:
                return got, len(duplicated_windows(records))
            time.sleep(5)

    # -- disturbances

    def disturb(self, kind: str, minute: float) -> None:
        began = self.clock()
        outcome: dict[str, Any] = {"minute": round(minute, 1), "kind": kind}
        try:
            outcome.update(getattr(self, kind)())
        except Exception as error:  # recorded; the end check says whether output suffered
            outcome["error"] = f"{type(error).__name__}: {error}"[:500]
        outcome["seconds"] = round(self.clock() - began, 1)
        self.events.append(outcome)

    def hot_swap(self) -> dict[str, Any]:
        """A filter change (a word never sent left out): swapped in the running driver."""
        self.swaps += 1
        stable = self.suite.status()["stableRevision"]
        self.suite.patch_pipeline("non-empty", filter=f"word != '' AND word != 'never-{self.swaps}'")
        done = self.suite.rollout_completed(stable, what="the soak's hot swap")
        return {"strategy": done.get("strategy"), "phase": done.get("phase")}

    def migration(self) -> dict[str, Any]:
        """The window from 5 s to 10 s or back: a checkpoint migration in the driver."""
        stable = self.suite.status()["stableRevision"]
        nodes = self.suite.app["spec"]["pipeline"]["nodes"]
        counts = next(n for n in nodes if n["name"] == "counts")
        window = "10s" if counts["aggregate"]["window"]["tumbling"] == "5s" else "5s"
        counts["aggregate"] = {**counts["aggregate"], "window": {"tumbling": window}}
        self.suite.patch_spec({"pipeline": {"nodes": nodes}})
        done = self.suite.rollout_completed(stable, what="the soak's checkpoint migration")
        return {"strategy": done.get("strategy"), "phase": done.get("phase"), "window": window}

    def driver_kill(self) -> dict[str, Any]:
        """The driver pod deleted at once; spark-operator starts another, which goes on from the checkpoint."""
        from .common import wait_for

        victim = self.suite.driver_pod()["metadata"]

        def new_driver_answers() -> bool:
            running = self.suite.running_driver_pods()
            if len(running) != 1 or running[0]["metadata"]["uid"] == victim["uid"]:
                return False
            try:
                return bool(self.suite.driver_api("/v1/status"))
            except Exception:  # not listening yet
                return False

        self.suite.target.kubectl(
            "delete", "pod", victim["name"], "-n", self.suite.apps_namespace, "--grace-period=0", "--force"
        )
        wait_for(new_driver_answers, timeout=self.suite.timeout, what="a new driver answering", interval=3)
        return {"killed": victim["name"]}

    # -- samples

    def record(self, minute: float, name: str, value: float | None) -> None:
        if value is not None:
            self.series[name].append((round(minute, 2), float(value)))

    def sample(self, minute: float) -> None:
        """One minute's figures; a figure that cannot be read now (a driver restarting) is left out."""
        for name, read in (
            ("driver", self.sample_driver),
            ("executors", self.sample_executors),
            ("operator", self.sample_operator),
            ("checkpoint", self.sample_checkpoint),
            ("kafka", self.sample_transactions),
            ("join", self.sample_join),
        ):
            try:
                read(minute)
            except Exception as error:  # a gap in the series, said in the figures
                self.record(minute, f"sample_errors_{name}", 1)
                print(f"soak: minute {minute:.1f}: {name}: {type(error).__name__}: {str(error)[:200]}")

    def read_pod(self, namespace: str, pod: str) -> PodFigures:
        return read_pod(self.suite.target, namespace, pod)

    def sample_driver(self, minute: float) -> None:
        metadata = self.suite.driver_pod()["metadata"]
        pod = metadata["name"]
        self.drivers.append((round(minute, 2), metadata["uid"]))
        figures = self.read_pod(self.suite.apps_namespace, pod)
        self.record(minute, "driver_pod_memory_bytes", figures.memory_bytes)
        self.record(minute, "driver_pod_anon_bytes", figures.anon_bytes)
        for role, prefix in (("jvm", "driver_jvm"), ("runner", "driver_runner")):
            for process in figures.of(role)[:1]:
                self.record(minute, f"{prefix}_rss_bytes", process.rss_bytes)
                self.record(minute, f"{prefix}_threads", process.threads)
                self.record(minute, f"{prefix}_open_files", process.files)
        text = self.suite.target.kubectl("exec", "-n", self.suite.apps_namespace, pod, "--", *driver_get("/metrics"))
        jvm = metric_values(
            text.stdout, ("sluice_jvm_memory_bytes", "sluice_jvm_threads", "sluice_jvm_native_memory_bytes")
        )
        for metric, value in jvm.items():
            self.record(minute, series_name(metric), value)
        status = self.suite.driver_api("/v1/status")
        backlog = sum(t.get("backlog") or 0 for t in status.get("topics") or [])
        self.record(minute, "backlog_records", backlog)
        self.record(minute, "executors", len(self.suite.running_executor_pods()))

    def sample_executors(self, minute: float) -> None:
        figures = [self.read_pod(self.suite.apps_namespace, pod) for pod in self.suite.running_executor_pods()]
        if not figures:
            return
        self.record(minute, "executor_pod_memory_max_bytes", max(f.memory_bytes for f in figures))
        self.record(minute, "executor_pod_anon_max_bytes", max(f.anon_bytes for f in figures))
        jvms = [p for f in figures for p in f.of("jvm")]
        if jvms:
            self.record(minute, "executor_jvm_rss_max_bytes", max(p.rss_bytes for p in jvms))
            self.record(minute, "executor_jvm_threads_max_threads", max(p.threads for p in jvms))
            self.record(minute, "executor_jvm_open_files_max_files", max(p.files for p in jvms))
        workers = [sum(p.rss_bytes for p in f.of("python-worker")) for f in figures]
        self.record(minute, "executor_python_workers_rss_max_bytes", max(workers))

    def sample_operator(self, minute: float) -> None:
        pods = json.loads(
            self.suite.target.kubectl(
                "get", "pods", "-n", self.suite.release_namespace, "-o", "json", "-l", self.suite.operator_selector
            ).stdout
        )["items"]  # fmt: skip
        running = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
        figures = self.read_pod(self.suite.release_namespace, running[0])
        self.record(minute, "operator_pod_memory_bytes", figures.memory_bytes)
        for process in figures.of("runner")[:1]:  # kopf's Python process
            self.record(minute, "operator_rss_bytes", process.rss_bytes)
            self.record(minute, "operator_threads", process.threads)
            self.record(minute, "operator_open_files", process.files)

    def sample_join(self, minute: float) -> None:
        """The join's driver: its pod's memory, its JVM's RSS and threads; its checkpoint on the store."""
        pod = self.suite.driver_pod(JOIN_APP)["metadata"]["name"]
        figures = self.read_pod(self.suite.apps_namespace, pod)
        self.record(minute, "join_driver_pod_memory_bytes", figures.memory_bytes)
        self.record(minute, "join_driver_pod_anon_bytes", figures.anon_bytes)
        for process in figures.of("jvm")[:1]:
            self.record(minute, "join_driver_jvm_rss_bytes", process.rss_bytes)
            self.record(minute, "join_driver_jvm_threads", process.threads)
        self.sample_checkpoint(minute, JOIN_APP, "join_")

    def sample_checkpoint(self, minute: float, app: str | None = None, prefix: str = "") -> None:
        from pyarrow.fs import FileSelector, FileType

        access = self.suite.object_store_access
        if access is None:
            return
        app = app or self.suite.app_name
        location = self.suite.app_status(app)["checkpointLocation"].removeprefix("s3a://").rstrip("/")
        root = f"{location}/{app}"
        sizes: Counter[str] = Counter()
        files = 0
        for info in access.filesystem().get_file_info(FileSelector(root, allow_not_found=True, recursive=True)):
            if info.type == FileType.File:
                sizes[checkpoint_kind(info.path.removeprefix(root + "/"))] += info.size or 0
                files += 1
        for kind in ("logs", "state", "sluice"):
            self.record(minute, f"{prefix}checkpoint_{kind}_bytes", sizes[kind])
        self.record(minute, f"{prefix}checkpoint_files", files)

    def sample_transactions(self, minute: float) -> None:
        listed = transactions(self.suite.kafka)
        if listed is None:
            return
        self.record(minute, "kafka_transactional_ids", len(listed))
        self.record(minute, "kafka_transactions_open", sum(1 for state in listed.values() if state == "Ongoing"))


# -- Kafka's own transaction listing (org.apache.kafka.tools.TransactionsCommand)


def transactions_classpath() -> str:
    from sluice.pipelines.local.kafka import KAFKA
    from sluice.pipelines.local.maven import fetch_jars

    tools = fetch_jars(
        "kafka-tools", [f"org.apache.kafka:kafka-tools:{KAFKA}"], cache_dir("kafka-tools", KAFKA) / "libs"
    )
    return os.pathsep.join(str(p) for p in tools)


def transactions_listed(text: str) -> dict[str, str]:
    """TransactionsCommand's `list` table: transactional id → state."""
    lines = [line.split() for line in text.splitlines() if line.strip()]
    if not lines or lines[0][:1] != ["TransactionalId"]:
        return {}
    state = lines[0].index("TransactionState")
    return {row[0]: row[state] for row in lines[1:] if len(row) > state}


def host_bootstrap(kafka: Any) -> str | None:
    """Where this process reaches the apps' Kafka (None: only through a pod, e.g. Strimzi's)."""
    if isinstance(kafka, SecuredHostKafka):
        return kafka.secured.host.bootstrap
    return kafka.bootstrap if isinstance(kafka, HostKafka) else None


def transactions(kafka: Any) -> dict[str, str] | None:
    """Every transactional id the brokers know, with its state; None where this process cannot reach Kafka."""
    bootstrap = host_bootstrap(kafka)
    if bootstrap is None:
        return None
    from sluice.pipelines.local.kafka import java_binary

    out = subprocess.run(
        [java_binary(), "-cp", transactions_classpath(), "org.apache.kafka.tools.TransactionsCommand",
         "--bootstrap-server", bootstrap, "list"],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    return transactions_listed(out.stdout)


# -- the record


def write_results(summary: dict[str, Any], series: dict[str, Series], directory: Path = SOAK_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (directory / "series.json").write_text(json.dumps(series) + "\n")
    return [directory / "summary.json", directory / "series.json", draw(series, summary, directory / "soak.png")]


def draw(series: dict[str, Series], summary: dict[str, Any], path: Path) -> Path:
    """Every series over time, one panel each, the warm-up shaded, the growth in the title."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = sorted(series)
    columns = 4
    rows = max(1, math.ceil(len(names) / columns))
    figure, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 2.6 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        minutes, values = zip(*series[name], strict=True) if series[name] else ((), ())
        unit = unit_of(name)
        scale, label = (2**20, "MiB") if unit == "bytes" else (1, unit)
        ax.plot(minutes, [v / scale for v in values], lw=1)
        ax.axvspan(0, summary.get("warmup_minutes", 0), color="0.9")
        growth = (summary["series"].get(name) or {}).get("growth_pct_per_hour")
        ax.set_title(f"{name}\n{'' if growth is None else f'{growth:+.1f} %/h after warm-up'}", fontsize=8)
        ax.set_ylabel(label, fontsize=7)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(names) :]:
        ax.axis("off")
    figure.suptitle(
        f"sluice soak: {summary['minutes']} min, {summary['records']} records, "
        f"{summary['lost']} lost, {summary['duplicated']} duplicated",
        fontsize=10,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=80)
    plt.close(figure)
    return path


def soak_app_settings(app: dict[str, Any]) -> dict[str, Any]:
    """The word count as the soak runs it: autoscaled (the autoscaler's default policy) between 1 and 2 executors,
    and Native Memory Tracking on in the driver (its cost: a few % of CPU)."""
    app = json.loads(json.dumps(app))
    app["spec"]["executors"] = {"instances": 1, "min": 1, "max": 2}
    app["spec"]["autoscaling"] = {"enabled": True}
    conf = app["spec"]["spark"].setdefault("sparkConf", {})
    conf["spark.driver.extraJavaOptions"] = " ".join(
        filter(None, [conf.get("spark.driver.extraJavaOptions"), NMT_OPTION])
    )
    return app


def planned(plan: SoakPlan) -> dict[str, Any]:
    return dataclasses.asdict(plan) | {"events": plan.events()}


__all__: Sequence[str] = ("Soak", "SoakPlan", "summarize", "write_results")
