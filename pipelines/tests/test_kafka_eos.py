"""Exactly-once Kafka output and read_committed Kafka input, in whole pipelines on real Kafka and Spark."""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer
from helpers import Harness, Record
from kafka_output import read_committed

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

WORDS = tuple(f"word{i:02d}" for i in range(30))


def words(seed: int, count: int) -> list[Record]:
    return [Record("frequency-words", w.encode(), None) for w in random.Random(seed).choices(WORDS, k=count)]


def forget_last_batch(checkpoint: Path) -> int:
    """Remove the query's record that its last batch completed, as if the driver had died after the batch's
    output was written but before Spark noted it: the next run replays that batch."""
    commits = checkpoint / "commits"
    last = max(int(f.name) for f in commits.iterdir() if f.name.isdigit())
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)
    return last


@pytest.mark.parametrize(
    ("delivery", "writers"), [("exactlyOnce", "driver"), ("exactlyOnce", "executors"), ("atLeastOnce", "auto")]
)
def test_a_batch_replayed_after_its_output_was_written(harness: Harness, delivery: str, writers: str) -> None:
    """The replayed batch writes nothing again with exactlyOnce (written by the driver, the default for this
    aggregation, or by Spark tasks); with atLeastOnce (Spark's sink) its records come twice, which shows the
    replay happened."""
    app = harness.load("frequency-count")
    app.node("out")["toKafka"].update(delivery=delivery, writers=writers)
    first, second = words(1, 800), words(2, 800)
    harness.produce(app, first)
    with harness.running(app, checkpoint="checkpoint") as run:
        harness.settle(run)
        harness.produce(app, second)
        harness.settle(run)
    before = harness.read(app, "frequency-counts")
    forget_last_batch(harness.tmp_path / "checkpoint" / "out")
    with harness.running(app, checkpoint="checkpoint") as run:
        harness.settle(run)
    after = harness.read(app, "frequency-counts")

    final = {json.loads(r.value or b"")["word"]: json.loads(r.value or b"")["count"] for r in after}
    assert final == Counter(r.value.decode() for r in first + second if r.value)
    known = {(r.partition, r.offset) for r in before}
    again = [(r.key, r.value) for r in after if (r.partition, r.offset) not in known]
    if delivery == "exactlyOnce":
        assert again == []
    else:
        assert again and set(again) <= {(r.key, r.value) for r in before}


@pytest.mark.parametrize("isolation", ["readCommitted", "readUncommitted"])
def test_a_source_reads_committed_records_only(harness: Harness, isolation: str) -> None:
    """Records of an aborted transaction in the input (an exactly-once writer's failed attempt) are not read,
    unless the source asks for readUncommitted."""
    app = harness.load("frequency-count")
    app.node("words")["fromKafka"]["isolationLevel"] = isolation
    topic = app.topics["frequency-words"]
    producer = Producer({"bootstrap.servers": harness.bootstrap, "transactional.id": f"{topic}-writer"})
    producer.init_transactions(30)
    for word, commit in (("committed", True), ("aborted", False), ("committed", True)):
        producer.begin_transaction()
        for _ in range(50):
            producer.produce(topic, word.encode())
        producer.flush(30)  # abort_transaction drops what was not sent yet
        producer.commit_transaction(30) if commit else producer.abort_transaction(30)
    harness.produce(app, [Record("frequency-words", b"plain", None)] * 20)
    with harness.running(app) as run:
        harness.settle(run)
    counts = {
        json.loads(r.value or b"")["word"]: json.loads(r.value or b"")["count"]
        for r in read_committed(harness.bootstrap, app.topics["frequency-counts"])
    }
    expected = {"committed": 100, "plain": 20} | ({"aborted": 50} if isolation == "readUncommitted" else {})
    assert counts == expected
