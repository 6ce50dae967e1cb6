"""Kafka side of the benchmarks: the word dictionary, a fast prefill, a paced producer and the raw consumer.

Producers run in spawned processes (never forked: the parent holds a JVM and py4j threads), so the
process measuring something never shares its interpreter with the process generating load.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import random
import time
from array import array
from bisect import bisect_left
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cache
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

DICTIONARY_SIZE = 9_000
DICTIONARY_SEED = 9_000
LETTERS = "abcdefghijklmnopqrstuvwxyz"

# Record timestamps of one partition: offsets (ascending) and their producer timestamps, in ms.
PartitionTimes = tuple[array, array]

CONSUMER_CONF = {
    "enable.auto.commit": False,
    "fetch.max.bytes": 64 << 20,
    "max.partition.fetch.bytes": 16 << 20,
    "queued.max.messages.kbytes": 256 << 10,
}


# ------------------------------------------------------------------------------------ the words


@cache
def dictionary(size: int = DICTIONARY_SIZE, seed: int = DICTIONARY_SEED) -> tuple[str, ...]:
    """`size` distinct lower-case words of 3-10 letters, the same on every run."""
    rng = random.Random(seed)
    words: dict[str, None] = {}
    while len(words) < size:
        words["".join(rng.choices(LETTERS, k=rng.randint(3, 10)))] = None
    return tuple(words)


@cache
def _zipf_cumulative(size: int) -> tuple[float, ...]:
    return tuple(itertools.accumulate(1.0 / rank for rank in range(1, size + 1)))


def word_stream(seed: int, count: int, words_per_record: int = 1) -> list[bytes]:
    """`count` records of words drawn with Zipf(1) frequencies (like natural text: a few words are very
    common), one word per record or lines of `words_per_record` words."""
    words = [w.encode() for w in dictionary()]
    drawn = random.Random(seed).choices(words, cum_weights=_zipf_cumulative(len(words)), k=count * words_per_record)
    if words_per_record == 1:
        return drawn
    return [b" ".join(drawn[i : i + words_per_record]) for i in range(0, len(drawn), words_per_record)]


def decode_counts(counts: Counter[bytes]) -> dict[str, int]:
    return {word.decode(): n for word, n in counts.items()}


def _spawn() -> multiprocessing.context.SpawnContext:
    return multiprocessing.get_context("spawn")


# ------------------------------------------------------------------------------------- prefill


def _bulk_producer(bootstrap: str) -> Producer:
    return Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 50,
            "batch.size": 4 << 20,
            "batch.num.messages": 500_000,
            "compression.type": "lz4",
            "queue.buffering.max.messages": 2_000_000,
            "queue.buffering.max.kbytes": 1 << 20,
            "delivery.report.only.error": True,
        }
    )


def _send(producer: Producer, topic: str, value: bytes, partition: int, key: bytes | None = None) -> None:
    while True:
        try:
            producer.produce(topic, value, key, partition=partition)
            return
        except BufferError:
            producer.poll(0.05)


def record_key(partition: int, index: int) -> bytes:
    """A keyed benchmark record's id: unique over the partitions of a topic."""
    return str(partition * 10_000_000_000 + index).encode()


def _prefill_partition(
    bootstrap: str, topic: str, partition: int, count: int, seed: int, words_per_record: int, keyed: bool
) -> dict[str, int]:
    values = word_stream(seed, count, words_per_record)
    producer = _bulk_producer(bootstrap)
    for index, value in enumerate(values):
        _send(producer, topic, value, partition, record_key(partition, index) if keyed else None)
    if producer.flush(300):
        raise RuntimeError(f"prefill of {topic}[{partition}] did not finish")
    return decode_counts(Counter(word for value in values for word in value.split()))


def prefill(
    bootstrap: str,
    topic: str,
    partitions: int,
    records: int,
    seed: int = 1,
    words_per_record: int = 1,
    keyed: bool = False,
) -> dict[str, int]:
    """Write `records` records (words, or lines of words; `keyed`: with a unique id as key) spread evenly over
    the partitions; returns how often each word was written.

    One spawned producer process per partition, as many at a time as there are cores.
    """
    shares = [records // partitions + (p < records % partitions) for p in range(partitions)]
    jobs = [(bootstrap, topic, p, n, seed * 1_000 + p, words_per_record, keyed) for p, n in enumerate(shares)]
    with _spawn().Pool(min(partitions, os.cpu_count() or 1)) as pool:
        per_partition = pool.starmap(_prefill_partition, jobs)
    total: Counter[str] = Counter()
    for counts in per_partition:
        total.update(counts)
    written = sum(end_offsets(bootstrap, topic).values())
    if written != records:
        raise RuntimeError(f"prefill wrote {written} records to {topic}, wanted {records}")
    return dict(total)


# ------------------------------------------------------------------------------ paced producer


@dataclass(frozen=True)
class Paced:
    """What a paced producer wrote: word counts and its wall-clock window (epoch ms)."""

    counts: dict[str, int]
    records: int
    started_ms: float
    ended_ms: float


def _paced_produce(
    bootstrap: str,
    topic: str,
    partitions: int,
    rate: float,
    seconds: float,
    seed: int,
    words_per_record: int,
    keyed: bool,
) -> Paced:
    total = int(rate * seconds)
    values = word_stream(seed, total, words_per_record)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1, "compression.type": "lz4"})
    started = time.time()
    sent = 0
    while sent < total:
        due = min(total, int((time.time() - started) * rate) + 1)
        for value in values[sent:due]:
            partition = sent % partitions
            _send(
                producer, topic, value, partition, record_key(partition, seed * 1_000_000_000 + sent) if keyed else None
            )
            sent += 1
        producer.poll(0)
        time.sleep(0.002)
    if producer.flush(60):
        raise RuntimeError(f"paced producer could not deliver everything to {topic}")
    counts = Counter(word for value in values for word in value.split())
    return Paced(decode_counts(counts), total, started * 1000, time.time() * 1000)


class PacedProducer:
    """Produce `rate` records/s round-robin over the partitions for `seconds`, in a spawned process."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        rate: float,
        seconds: float,
        seed: int = 7,
        words_per_record: int = 1,
        keyed: bool = False,
    ) -> None:
        self._args = (bootstrap, topic, partitions, rate, seconds, seed, words_per_record, keyed)
        self._pool = _spawn().Pool(1)
        self._result = None

    def start(self) -> PacedProducer:
        self._result = self._pool.apply_async(_paced_produce, self._args)
        return self

    def done(self) -> bool:
        return self._result is not None and self._result.ready()

    def result(self, timeout: float) -> Paced:
        assert self._result is not None, "start() first"
        try:
            return self._result.get(timeout)
        finally:
            self._pool.close()
            self._pool.join()


# ------------------------------------------------------------------------------------ consumers


def _assigned_consumer(bootstrap: str, topic: str, conf: dict[str, Any] | None = None) -> tuple[Consumer, list[int]]:
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"sluice-bench-{time.time_ns()}", **CONSUMER_CONF, **(conf or {})}
    )
    partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in partitions])
    return consumer, partitions


def end_offsets(bootstrap: str, topic: str) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "sluice-bench-offsets"})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        return {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in partitions}
    finally:
        consumer.close()


def _drain(
    bootstrap: str,
    topic: str,
    on_batch: Callable[[list[Message]], None],
    finished: Callable[[], bool],
    timeout_s: float,
) -> None:
    """Consume the topic from the beginning, handing each fetched batch to on_batch, until finished()."""
    consumer, _ = _assigned_consumer(bootstrap, topic)
    deadline = time.monotonic() + timeout_s
    try:
        while not finished():
            if time.monotonic() > deadline:
                raise TimeoutError(f"consuming {topic} did not finish within {timeout_s:.0f}s")
            batch = _fetched(consumer)
            for msg in batch:
                if msg.error() is not None:
                    raise KafkaException(msg.error())
            on_batch(batch)
    finally:
        consumer.close()


def _fetched(consumer: Consumer) -> list[Message]:
    """Wait (a little) for one record, then take whatever else is already fetched without waiting:
    consume(n, timeout) alone would hold records back until n arrived or the timeout passed."""
    first = consumer.poll(0.2)
    if first is None:
        return []
    return [first, *consumer.consume(num_messages=100_000, timeout=0)]


def raw_consume_seconds(bootstrap: str, topic: str, records: int, timeout_s: float = 900) -> float:
    """Seconds one confluent-kafka consumer takes to fetch every record of the topic (no processing)."""
    seen = 0

    def count(batch: list[Message]) -> None:
        nonlocal seen
        seen += len(batch)

    started = time.perf_counter()
    _drain(bootstrap, topic, count, lambda: seen >= records, timeout_s)
    return time.perf_counter() - started


def raw_consume_latencies(
    bootstrap: str, topic: str, producer: PacedProducer, timeout_s: float
) -> tuple[array, array, Paced]:
    """Consume while the paced producer runs. Per record: its producer timestamp, and its latency =
    arrival in this process - producer timestamp (both epoch ms)."""
    stamps, latencies = array("d"), array("d")
    paced: Paced | None = None

    def record(batch: list[Message]) -> None:
        now_ms = time.time() * 1000
        produced = [m.timestamp()[1] for m in batch]
        stamps.extend(produced)
        latencies.extend(now_ms - ts for ts in produced)

    def finished() -> bool:
        nonlocal paced
        if paced is None and producer.done():
            paced = producer.result(0)
        return paced is not None and len(stamps) >= paced.records

    _drain(bootstrap, topic, record, finished, timeout_s)
    assert paced is not None
    return stamps, latencies, paced


def record_timestamps(bootstrap: str, topic: str) -> dict[int, PartitionTimes]:
    """Offsets and producer timestamps of every record now in the topic, per partition."""
    ends = end_offsets(bootstrap, topic)
    times: dict[int, PartitionTimes] = {p: (array("q"), array("q")) for p in ends}
    position = dict.fromkeys(ends, 0)

    def keep(batch: list[Message]) -> None:
        for msg in batch:
            offsets, stamps = times[msg.partition()]
            offsets.append(msg.offset())
            stamps.append(msg.timestamp()[1])
            position[msg.partition()] = msg.offset() + 1

    _drain(bootstrap, topic, keep, lambda: all(position[p] >= ends[p] for p in ends), 600)
    return times


@dataclass
class PartitionRecords:
    """One partition's records in offset order."""

    offsets: array
    timestamps: array  # producer timestamps, ms
    values: list[bytes]

    def between(self, start: int, end: int) -> range:
        """Indexes of the records with start <= offset < end."""
        return range(bisect_left(self.offsets, start), bisect_left(self.offsets, end))


def partition_records(bootstrap: str, topic: str) -> dict[int, PartitionRecords]:
    """Offsets, producer timestamps and values of every record now in the topic, per partition."""
    ends = end_offsets(bootstrap, topic)
    records = {p: PartitionRecords(array("q"), array("q"), []) for p in ends}
    position = dict.fromkeys(ends, 0)

    def keep(batch: list[Message]) -> None:
        for msg in batch:
            kept = records[msg.partition()]
            kept.offsets.append(msg.offset())
            kept.timestamps.append(msg.timestamp()[1])
            kept.values.append(msg.value() or b"")
            position[msg.partition()] = msg.offset() + 1

    _drain(bootstrap, topic, keep, lambda: all(position[p] >= ends[p] for p in ends), 600)
    return records


def records_to_end(batch: list[Message], at_end: set[int]) -> Iterator[Message]:
    """The records of a fetched batch (a consumer with enable.partition.eof); partitions whose end it reports
    join `at_end`."""
    for msg in batch:
        error = msg.error()
        if error is None:
            yield msg
        elif error.code() == KafkaError._PARTITION_EOF:
            at_end.add(msg.partition())
        else:
            raise KafkaException(error)


Arrivals = dict[tuple[bytes | None, bytes | None], float]  # (key, value) -> first seen, epoch ms


def _tail(bootstrap: str, topic: str, stop: Any, arrivals: Any) -> None:
    """Note when each (key, value) first reaches a read_committed consumer, until `stop` is set and the topic
    is read to its end; then hand the arrivals over."""
    consumer, partitions = _assigned_consumer(bootstrap, topic, {"enable.partition.eof": True})
    first: Arrivals = {}
    at_end: set[int] = set()
    try:
        while not (stop.is_set() and len(at_end) == len(partitions)):
            batch = _fetched(consumer)
            now_ms = time.time() * 1000
            for msg in records_to_end(batch, at_end):
                first.setdefault((msg.key(), msg.value()), now_ms)
                at_end.discard(msg.partition())
    finally:
        consumer.close()
    arrivals.put(first)


class OutputTail:
    """A read_committed consumer in a spawned process noting when each output record becomes visible."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        context = _spawn()
        self._stop, self._arrivals = context.Event(), context.Queue()
        self._process = context.Process(target=_tail, args=(bootstrap, topic, self._stop, self._arrivals), daemon=True)

    def start(self) -> OutputTail:
        self._process.start()
        return self

    def arrivals(self, timeout: float = 600) -> Arrivals:
        """Stop once the topic is read to its end; when each (key, value) arrived."""
        self._stop.set()
        first = self._arrivals.get(timeout=timeout)
        self._process.join(60)
        return first


def timestamps_between(times: PartitionTimes, start: int, end: int) -> array:
    """Producer timestamps of the records with start <= offset < end."""
    offsets, stamps = times
    return stamps[bisect_left(offsets, start) : bisect_left(offsets, end)]


def committed_records(bootstrap: str, topic: str, timeout_s: float = 600) -> list[Message]:
    """Every record of the topic up to its end, as a read_committed consumer sees it. Transaction markers
    take offsets, so the end is where librdkafka reports it (the last stable offset), not a last offset."""
    consumer, partitions = _assigned_consumer(bootstrap, topic, {"enable.partition.eof": True})
    records: list[Message] = []
    at_end: set[int] = set()
    deadline = time.monotonic() + timeout_s
    try:
        while len(at_end) < len(partitions):
            if time.monotonic() > deadline:
                raise TimeoutError(f"reading {topic} to its end took over {timeout_s:.0f}s")
            records.extend(records_to_end(_fetched(consumer), at_end))
    finally:
        consumer.close()
    return records


def final_counts(bootstrap: str, topic: str) -> dict[str, int]:
    """The latest count per word in a running-count output topic (key: word, value: count).

    Counts only grow, so the largest value seen for a word is its final count."""
    counts: dict[str, int] = {}
    for record in committed_records(bootstrap, topic):
        word, count = (record.key() or b"").decode(), _count_of(record.value() or b"")
        counts[word] = max(count, counts.get(word, 0))
    return counts


def _count_of(value: bytes) -> int:
    text = value.decode()
    if text.startswith("{"):
        return int(json.loads(text)["count"])
    return int(text)
