"""`make overload`: an app fed three times what its capped executors can do for SLUICE_OVERLOAD_MINUTES
(default 10), then a fifth of what they can do until it caught up, on the local cluster.

The app is the autoscale step's (each record costs ~30 ms of a half core, so the capacity is small and the load
cheap to send), its executors autoscaled up to MAX_EXECUTORS, its source bounded to BATCH_BOUND records a
micro-batch (`maxRecordsPerTrigger`). Sampled every SAMPLE_SECONDS: the backlog, the executors, the batches
and their rows (the driver's /v1/status), the pods' cgroup memory, their restarts and OOM kills. At the end:
every record out exactly once, no pod OOM-killed or restarted, no executor lost while overloaded, every batch
within the bound, the backlog back under CAUGHT_UP_SECONDS of capacity. The results go to .sluice/overload/:
summary.json and samples.json.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sluice.operator.names import APP_LABEL

from .common import REPO_ROOT, minutes_from_env, wait_for
from .e2e_suite import E2ESuite, PacedLoad, autoscale_app, word_tally
from .soak import read_pod

OVERLOAD_DIR = REPO_ROOT / ".sluice" / "overload"
MINUTES_ENV = "SLUICE_OVERLOAD_MINUTES"
APP, WORDS_TOPIC, OUT_TOPIC = "overload", "overload-words", "overload-weighed"
MAX_EXECUTORS = 2
BATCH_BOUND = 400  # records a micro-batch reads at most: ~10-20 s of the capped executors' work here
SAMPLE_SECONDS = 10.0
CAUGHT_UP_SECONDS = 30.0  # caught up: a backlog of at most this much of the capacity's work


@dataclass(frozen=True)
class OverloadPlan:
    minutes: float = 10.0
    factor: float = 3.0  # the overload, times the capacity
    after: float = 0.2  # the load once the overload ends, times the capacity

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> OverloadPlan:
        return cls(minutes_from_env(MINUTES_ENV, cls.minutes, 2, environ))


@dataclass(frozen=True)
class Sample:
    t: float  # seconds since the overload began
    phase: str  # "overload" or "after"
    rate: float  # records/s sent
    backlog: int
    read: int  # records the query read so far (the topic's latest offsets - the backlog)
    batches: int  # batches the query completed (since its driver started)
    input_rows: int  # rows those batches read
    executors: tuple[str, ...]  # the running executor pods
    driver_memory_bytes: int | None
    executor_memory_max_bytes: int | None


def batch_rows(samples: Sequence[Sample]) -> list[float]:
    """The mean rows of the batches completed between each two samples of one driver (its counters only grow)."""
    rows = []
    for before, after in itertools.pairwise(samples):
        batches, read = after.batches - before.batches, after.input_rows - before.input_rows
        if batches > 0 and read >= 0:
            rows.append(read / batches)
    return rows


def executors_gone(samples: Sequence[Sample]) -> list[str]:
    """Executor pods that ran at one sample and not at a later one."""
    seen: set[str] = set()
    gone: set[str] = set()
    for sample in samples:
        gone |= seen - set(sample.executors)
        seen |= set(sample.executors)
    return sorted(gone)


def processed_per_second(samples: Sequence[Sample]) -> float | None:
    """Records read per second from the first to the last sample; None with fewer than two or no time between."""
    if len(samples) < 2 or samples[-1].t <= samples[0].t:
        return None
    return (samples[-1].read - samples[0].read) / (samples[-1].t - samples[0].t)


def overload_app(suite: E2ESuite) -> dict[str, Any]:
    """The autoscale step's app under its own name and topics, capped at MAX_EXECUTORS, its batches bounded."""
    app = autoscale_app(suite.apps_namespace, suite.images, suite.kafka.app_kafka(), suite.CHECKPOINT_CLAIM)
    spec = app["spec"]
    app["metadata"]["name"] = APP
    spec["topics"] = [{"name": topic, "partitions": 4} for topic in (WORDS_TOPIC, OUT_TOPIC)]
    spec["executors"] = {"instances": 1, "min": 1, "max": MAX_EXECUTORS}
    nodes = spec["pipeline"]["nodes"]
    nodes[0]["fromKafka"] = {"topic": WORDS_TOPIC, "format": "text", "maxRecordsPerTrigger": BATCH_BOUND}
    nodes[-1]["toKafka"] = {**nodes[-1]["toKafka"], "topic": OUT_TOPIC}
    return app


@dataclass
class Overload:
    suite: E2ESuite
    plan: OverloadPlan
    samples: list[Sample] = field(default_factory=list)
    pods: dict[str, dict[str, Any]] = field(default_factory=dict)  # every pod of the app seen: name -> its last state

    def run(self) -> dict[str, Any]:
        """The overload, then the summary (the cluster set up to deploy_app)."""
        suite = self.suite
        suite.target.apply(overload_app(suite))
        wait_for(
            lambda: suite.app_status(APP).get("phase") == "Running" and suite.app_status(APP).get("observedAt"),
            timeout=suite.timeout,
            what=f"{APP} running, its driver answering the operator",
        )
        driver = suite.driver_identity(APP)
        load = PacedLoad(suite.kafka, WORDS_TOPIC).start(3)
        try:
            warm = suite.rate_per_executor(APP, settle=45)  # what one executor does per busy second, warmed up
            # The rate measured at a low load understates a saturated executor (each batch's fixed cost): the load
            # starts from it and is set again after each sample, once every executor runs, to `factor` times what
            # was read over the last minute at the cap (a first run set it once, too early: 1.57x).
            load.rate = round(self.plan.factor * MAX_EXECUTORS * warm, 1)
            began = time.monotonic()
            while time.monotonic() - began < self.plan.minutes * 60:
                sample = self.sample(began, "overload", load.rate)
                at_cap = [s for s in self.samples if len(s.executors) == MAX_EXECUTORS and s.t >= sample.t - 60]
                read = processed_per_second(at_cap) if len(sample.executors) == MAX_EXECUTORS else None
                if read:
                    load.rate = max(load.rate, round(self.plan.factor * read, 1))
                time.sleep(SAMPLE_SECONDS)
            overloaded = [s for s in self.samples if s.phase == "overload"]
            saturated = overloaded[len(overloaded) // 2 :]  # executors at the cap, every batch full
            capacity = processed_per_second(saturated) or 0.0
            load.rate = round(self.plan.after * capacity, 1)
            fell = time.monotonic()
            caught_up = max(1.0, CAUGHT_UP_SECONDS * capacity)
            peak = max(s.backlog for s in self.samples)
            patience = peak / max(capacity - load.rate, 0.1) * 2 + 300  # twice the time it takes, and some
            wait_for(
                lambda: self.sample(began, "after", load.rate).backlog <= caught_up,
                timeout=patience,
                what=f"the backlog under {caught_up:.0f} records after the load fell",
                interval=SAMPLE_SECONDS,
            )
            catch_up_seconds = time.monotonic() - fell
        finally:
            sent = load.stop()
        got = wait_for(
            lambda: (c := word_tally(suite.kafka.consume(OUT_TOPIC))).total() >= sent.total() and c,
            timeout=suite.timeout,
            what=f"{sent.total()} records out",
            interval=5,
        )
        assert isinstance(got, Counter)
        restarted = suite.driver_identity(APP) != driver
        self.read_pods()
        suite.delete_app(APP)
        return self.summary(sent, got, warm, capacity, catch_up_seconds, restarted)

    def sample(self, began: float, phase: str, rate: float) -> Sample:
        suite = self.suite
        status = suite.driver_api("/v1/status", APP)
        query = next(q for q in status["queries"] if q["name"] == "out")
        topic = next(t for t in status["topics"] if t["topic"] == WORDS_TOPIC)
        pods = self.read_pods()
        executors = [name for name, pod in pods.items() if pod["role"] == "executor" and pod["running"]]
        driver_pod = next((name for name, pod in pods.items() if pod["role"] == "driver" and pod["running"]), None)
        executor_memory = [read_pod(suite.target, suite.apps_namespace, pod).memory_bytes for pod in executors]
        sample = Sample(
            t=round(time.monotonic() - began, 1),
            phase=phase,
            rate=rate,
            backlog=int(topic["backlog"]),
            read=int(topic["latestOffsets"]) - int(topic["backlog"]),
            batches=int(query["batches"]),
            input_rows=int(query["inputRows"]),
            executors=tuple(sorted(executors)),
            driver_memory_bytes=(
                read_pod(suite.target, suite.apps_namespace, driver_pod).memory_bytes if driver_pod else None
            ),
            executor_memory_max_bytes=max(executor_memory, default=None),
        )
        self.samples.append(sample)
        return sample

    def read_pods(self) -> dict[str, dict[str, Any]]:
        """The app's pods now; each one seen is kept in self.pods with its restarts and why it last ended."""
        listed = json.loads(
            self.suite.target.kubectl(
                "get", "pods", "-n", self.suite.apps_namespace, "-l", f"{APP_LABEL}={APP}", "-o", "json"
            ).stdout
        )["items"]
        now = {}
        for pod in listed:
            statuses = pod["status"].get("containerStatuses") or []
            ended = [
                (s.get("lastState") or {}).get("terminated") or (s.get("state") or {}).get("terminated") or {}
                for s in statuses
            ]
            now[pod["metadata"]["name"]] = {
                "role": pod["metadata"].get("labels", {}).get("spark-role", "other"),
                "running": pod["status"].get("phase") == "Running" and not pod["metadata"].get("deletionTimestamp"),
                "restarts": sum(int(s.get("restartCount") or 0) for s in statuses),
                "ended": sorted({e.get("reason", "") for e in ended if e}),
                "reason": pod["status"].get("reason"),
            }
        self.pods.update(now)
        return now

    def summary(
        self, sent: Counter[str], got: Counter[str], warm: float, capacity: float, catch_up: float, restarted: bool
    ) -> dict[str, Any]:
        overloaded = [s for s in self.samples if s.phase == "overload"]
        memory = [s.driver_memory_bytes for s in self.samples if s.driver_memory_bytes]
        executor_memory = [s.executor_memory_max_bytes for s in self.samples if s.executor_memory_max_bytes]
        return {
            "plan": dataclasses.asdict(self.plan),
            "batch_bound": BATCH_BOUND,
            "max_executors": MAX_EXECUTORS,
            "warm_rate_per_executor": round(warm, 1),
            "capacity_per_second": round(capacity, 1),
            "overload_rate": overloaded[-1].rate if overloaded else None,
            "overload_factor": round(overloaded[-1].rate / capacity, 2) if overloaded and capacity else None,
            "backlog_peak": max((s.backlog for s in self.samples), default=0),
            "backlog_at_overload_end": overloaded[-1].backlog if overloaded else None,
            "batch_rows_max": round(max(batch_rows(self.samples), default=0), 1),
            "driver_memory_max_bytes": max(memory, default=None),
            "executor_memory_max_bytes": max(executor_memory, default=None),
            "catch_up_seconds": round(catch_up, 1),
            "records": sent.total(),
            "lost": (sent - got).total(),
            "duplicated": (got - sent).total(),
            "driver_restarted": restarted,
            "pods": self.pods,
            "executors_peak": max((len(s.executors) for s in overloaded), default=0),
            "executors_lost_while_overloaded": executors_gone(overloaded),  # the autoscaler never scales down then
            "oom_killed": sorted(name for name, pod in self.pods.items() if "OOMKilled" in pod["ended"]),
            "restarts": sum(pod["restarts"] for pod in self.pods.values()),
        }


def write_results(summary: dict[str, Any], samples: Sequence[Sample]) -> list[str]:
    OVERLOAD_DIR.mkdir(parents=True, exist_ok=True)
    (OVERLOAD_DIR / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (OVERLOAD_DIR / "samples.json").write_text(json.dumps([dataclasses.asdict(s) for s in samples]) + "\n")
    return [str(OVERLOAD_DIR / "summary.json"), str(OVERLOAD_DIR / "samples.json")]
