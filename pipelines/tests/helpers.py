"""Shared helpers of the pipeline tests.

- `load_example`: an example manifest with every topic renamed to a fresh one and file paths made absolute,
- `Harness`: runs a pipeline for real (PipelineRun on the session's Spark and Kafka) and produces records,
- `replay`: the event-time reference — which records Spark must treat as late, phase by phase,
- readers of Kafka output, dead letters and Prometheus samples.

Event-time tests produce their records in phases, each once the pipeline has caught up with the previous
one: the watermark only moves between micro-batches, so a record's lateness is only deterministic when it
is known which records were processed before it.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

from kafka_output import read_committed
from pyspark.sql import SparkSession

from sluice.api.validation import PipelineDocument, document_from, load_documents
from sluice.pipelines.local.kafka_io import ConsumedRecord, produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.testbed.manifests import retarget_topics

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = REPO_ROOT / "pipelines" / "examples"
EXAMPLE_NAMES = tuple(sorted(p.stem for p in EXAMPLES.glob("*.yaml")))

HOUR_MS = 3_600_000
# Event times of generated data start on a whole hour a few hours ago: the data and its windows are the
# same on every run, yet Kafka keeps it (records become deletable once their timestamp is older than the
# broker's retention) and the far-future records that close windows still lie in the past.
BASE_MS = (int(time.time() * 1000) // HOUR_MS - 6) * HOUR_MS


# ------------------------------------------------------------------------------------ examples


def load_manifest(name: str) -> dict[str, Any]:
    document = load_documents(EXAMPLES / f"{name}.yaml")[0]
    assert document.manifest is not None, f"{name}.yaml is not a StreamingApp manifest"
    return document.manifest


@dataclass
class Example:
    """An example manifest retargeted for one test. Tests may edit `pipeline` before starting it."""

    name: str
    manifest: dict[str, Any]
    topics: dict[str, str]  # topic name in the manifest -> this test's topic

    @property
    def pipeline(self) -> dict[str, Any]:
        return self.manifest["spec"]["pipeline"]

    def node(self, name: str) -> dict[str, Any]:
        return next(n for n in self.pipeline["nodes"] if n["name"] == name)

    def document(self) -> PipelineDocument:
        return document_from(copy.deepcopy(self.manifest), str(EXAMPLES / f"{self.name}.yaml"))


def load_example(name: str, new_topic: Callable[..., str]) -> Example:
    """The example with each topic of spec.topics replaced by a fresh one (same partition count) and
    relative lookup paths resolved against the repo root, where the manifests expect to be run."""
    manifest = load_manifest(name)
    topics = retarget_topics(manifest, lambda t: new_topic(partitions=t.get("partitions", 1), prefix=t["name"]))
    for node in manifest["spec"]["pipeline"]["nodes"]:
        if "lookup" in node and not Path(node["lookup"]["path"]).is_absolute():
            node["lookup"]["path"] = str(REPO_ROOT / node["lookup"]["path"])
    return Example(name, manifest, topics)


# ------------------------------------------------------------------------------------ records


@dataclass(frozen=True)
class Record:
    """A record to produce, with what the reference needs to know about it."""

    topic: str  # the topic's name in the manifest
    value: bytes | None
    event_ms: int | None  # None for records without a valid event time
    kafka_ms: int | None = None  # the Kafka timestamp (default: when produced)
    error: str | None = None  # for bad records: the start of the dead-letter error they must get
    data: Any = None  # the record's fields, for the reference

    @property
    def bad(self) -> bool:
        return self.error is not None


def iso(ms: int) -> str:
    """Epoch milliseconds as the ISO-8601 text Spark's JSON reader and writer use."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def epoch_ms(text: str) -> int:
    return round(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def json_bytes(data: dict[str, Any]) -> bytes:
    return json.dumps(data, separators=(",", ":")).encode()


# ---------------------------------------------------------------------------- event-time model


def window_start(event_ms: int, size_ms: int) -> int:
    return event_ms - event_ms % size_ms


def window_closed(event_ms: int, size_ms: int, watermark_ms: int) -> bool:
    """Spark's rule for a tumbling-window aggregation: a window is final, and later records for it are
    dropped, once its end is at or before the watermark."""
    return window_start(event_ms, size_ms) + size_ms <= watermark_ms


def behind_watermark(event_ms: int, watermark_ms: int) -> bool:
    """Spark's rule for other stateful operators (joins, dedupe): dropped at or before the watermark."""
    return event_ms <= watermark_ms


@dataclass
class Replay:
    on_time: list[Record] = field(default_factory=list)
    late: list[Record] = field(default_factory=list)
    bad: list[Record] = field(default_factory=list)
    watermarks: list[int | None] = field(default_factory=list)  # per phase, then the final one

    @property
    def final_watermark(self) -> int:
        last = self.watermarks[-1]
        assert last is not None
        return last

    def dead_letters(self, late_too: bool) -> list[Record]:
        return self.bad + (self.late if late_too else [])


def replay(
    phases: Sequence[Sequence[Record]],
    delay_ms: int,
    is_late: Callable[[int, int], bool],
    filtered: Callable[[Record], bool] = lambda _: True,
) -> Replay:
    """Which records Spark processes, given phases each produced once the previous one was processed.

    The watermark of a phase is min over sources (topics) of (max event time seen before - delay): Spark's
    default multiple-watermark policy. Bad records never reach the watermark; late ones still raise it.
    Records a filter right after the source leaves out (`filtered` false) are never late and do not raise
    it either: Spark runs such a filter below the watermark.
    """
    result = Replay()
    maxima: dict[str, int] = {}

    def current() -> int | None:
        return min(maxima.values()) - delay_ms if maxima else None

    for phase in phases:
        watermark = current()
        result.watermarks.append(watermark)
        for record in phase:
            if record.bad:
                result.bad.append(record)
                continue
            assert record.event_ms is not None
            if watermark is not None and filtered(record) and is_late(record.event_ms, watermark):
                result.late.append(record)
            else:
                result.on_time.append(record)
        for record in phase:
            if not record.bad and record.event_ms is not None and filtered(record):
                maxima[record.topic] = max(maxima.get(record.topic, record.event_ms), record.event_ms)
    result.watermarks.append(current())
    return result


# ------------------------------------------------------------------------------------- running


def wait_for(
    condition: Callable[[], bool], timeout: float, describe: Callable[[], str], check: Callable[[], None] = lambda: None
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        check()
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s: {describe()}")
        time.sleep(0.25)


def watermark_of(run: PipelineRun, query: str) -> int | None:
    for state in run.states():
        if state.name == query and state.progress:
            text = (state.progress.get("eventTime") or {}).get("watermark")
            return epoch_ms(text) if text else None
    return None


@dataclass
class Harness:
    """Runs examples on the test session's Spark and Kafka."""

    spark: SparkSession
    bootstrap: str
    new_topic: Callable[..., str]
    tmp_path: Path
    timeout: float = 240.0

    def load(self, name: str) -> Example:
        return load_example(name, self.new_topic)

    @contextmanager
    def running(self, example: Example, checkpoint: str = "checkpoints") -> Iterator[PipelineRun]:
        run = PipelineRun.from_document(
            self.spark,
            example.document(),
            checkpoint_root=str(self.tmp_path / checkpoint),
            bootstrap_servers=self.bootstrap,
        ).start()
        try:
            yield run
        finally:
            run.stop()

    def produce(self, example: Example, records: Iterable[Record]) -> None:
        by_topic: dict[str, list[Record]] = {}
        for record in records:
            by_topic.setdefault(record.topic, []).append(record)
        now = int(time.time() * 1000)
        for topic, batch in by_topic.items():
            produce(
                self.bootstrap,
                example.topics[topic],
                [(None, r.value) for r in batch],
                timestamps_ms=[r.kafka_ms if r.kafka_ms is not None else now for r in batch],
            )

    def settle(self, run: PipelineRun, query: str | None = None, watermark_ms: int | None = None) -> None:
        """Wait until the run has processed everything produced; with a watermark, also until `query`
        reports it (then the no-data batch that evicts state under it has run)."""
        run.wait_until_caught_up(self.timeout)
        if query is not None and watermark_ms is not None:
            wait_for(
                lambda: watermark_of(run, query) == watermark_ms,
                self.timeout,
                lambda: f"watermark of {query}: {watermark_of(run, query)}, expected {watermark_ms}",
                check=run.raise_if_failed,
            )
            run.wait_until_caught_up(self.timeout)

    @contextmanager
    def run_phases(
        self, example: Example, phases: Sequence[Sequence[Record]], query: str, watermarks: Sequence[int | None]
    ) -> Iterator[PipelineRun]:
        """Run the example over phases of records: the first produced before the start (so one batch
        reads it all), each next one once the previous was processed and `query` reached the watermark
        expected after it (watermarks[i + 1], as in Replay.watermarks). Yields the run, still running."""
        self.produce(example, phases[0])
        with self.running(example) as run:
            self.settle(run, query, watermarks[1])
            for i, phase in enumerate(phases[1:], start=1):
                self.produce(example, phase)
                self.settle(run, query, watermarks[i + 1])
            yield run

    def read(self, example: Example, topic: str) -> list[ConsumedRecord]:
        return read_committed(self.bootstrap, example.topics[topic])

    def read_json(self, example: Example, topic: str) -> list[dict[str, Any]]:
        return [json.loads(r.value or b"null", parse_float=Decimal) for r in self.read(example, topic)]


def latest_per_key(records: Iterable[ConsumedRecord]) -> dict[bytes | None, ConsumedRecord]:
    """The newest record of each key (a key's records share a partition, so offsets order them)."""
    out: dict[bytes | None, ConsumedRecord] = {}
    for record in sorted(records, key=lambda r: (r.partition, r.offset)):
        out[record.key] = record
    return out


# -------------------------------------------------------------------------------- dead letters


@dataclass(frozen=True)
class DeadLetter:
    value: bytes | None
    error: str
    source: str


def read_dead_letters(harness: Harness, example: Example, topic: str) -> list[DeadLetter]:
    out = []
    for record in harness.read(example, topic):
        headers = {k: (v or b"").decode() for k, v in record.headers}
        out.append(DeadLetter(record.value, headers["sluice.error"], headers["sluice.source"]))
    return out


def assert_dead_letters(
    actual: Sequence[DeadLetter],
    expected: Sequence[Record],
    source_of: Callable[[Record], str],
    late_error: str = "late:",
) -> None:
    """Each expected record arrived once with its original bytes, its source and the right error: its
    own `error` prefix for bad records, `late_error` for late ones."""

    def ordering(letter: DeadLetter) -> tuple[bytes, str, str]:
        return letter.value or b"", letter.source, letter.error

    got = sorted(actual, key=ordering)
    want = sorted((DeadLetter(r.value, r.error or late_error, source_of(r)) for r in expected), key=ordering)
    assert [(g.value, g.source) for g in got] == [(w.value, w.source) for w in want]
    for g, w in zip(got, want, strict=True):
        assert g.error.startswith(w.error), f"dead letter {g.value!r}: error {g.error!r}, expected {w.error}..."


# -------------------------------------------------------------------------------------- metrics


def sample(run: PipelineRun, name: str, **labels: str) -> float | None:
    return run.metrics.registry.get_sample_value(name, {"app": run.metrics.app, **labels})


def assert_sample(run: PipelineRun, name: str, expected: float, timeout: float = 30.0, **labels: str) -> None:
    """Progress reaches the metrics through Spark's asynchronous listener bus: allow it a moment."""
    wait_for(
        lambda: (sample(run, name, **labels) or 0.0) == expected,
        timeout,
        lambda: f"{name}{labels} = {sample(run, name, **labels)}, expected {expected}",
    )
