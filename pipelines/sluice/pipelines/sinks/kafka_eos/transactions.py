"""Kafka client plumbing for the transactions: transient errors retried with backoff, fresh metadata, and
the last commit marker read back from a partition (read_committed)."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    retry_if_exception_type,
    stop_after_attempt,
    stop_after_delay,
    wait_exponential,
    wait_fixed,
)

from .settings import CLIENT_TIMEOUT_S, COMMIT_HEADER, Header, T, log


@dataclass(frozen=True)
class Marker:
    """The `sluice.commit` header on the last record of every transaction."""

    writer: str
    query_id: str
    batch_id: int

    def header(self) -> Header:
        return COMMIT_HEADER, json.dumps(
            {"writer": self.writer, "query": self.query_id, "batch": self.batch_id}
        ).encode()

    @classmethod
    def of(cls, headers: Iterable[Header] | Mapping[str, str | bytes | None] | None) -> Marker | None:
        for name, value in headers.items() if isinstance(headers, Mapping) else headers or ():
            if name == COMMIT_HEADER and value:
                data = json.loads(value)
                return cls(data["writer"], data["query"], int(data["batch"]))
        return None

    def covers(self, other: Marker) -> bool:
        """Whether this commit already holds `other`'s batch (batch ids count within one checkpoint)."""
        return (self.writer, self.query_id) == (other.writer, other.query_id) and self.batch_id >= other.batch_id


TRANSIENT = frozenset(
    {
        KafkaError._UNKNOWN_PARTITION,
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError._TRANSPORT,
        KafkaError._TIMED_OUT,
        KafkaError.REQUEST_TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
    }
)


def transient(error: KafkaError) -> bool:
    return error.code() in TRANSIENT or (error.retriable() and not error.fatal())


def _retriable(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and exc.args[0].retriable()


def _transient(exc: BaseException) -> bool:
    return isinstance(exc, KafkaException) and transient(exc.args[0])


def _trying_again(
    name: str, doing: str = "trying again", level: int = logging.INFO
) -> Callable[[RetryCallState], None]:
    """Tenacity's before_sleep: the error that is tried again, logged with `name`."""

    def say(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome else None
        message = error.args[0].str() if isinstance(error, KafkaException) else error
        log.log(level, "%s: %s; %s", name, message, doing)

    return say


def retried(call: Callable[[float], None]) -> None:
    """A transactional call (init_transactions, commit_transaction) made again while it fails with an error
    librdkafka marks retriable, for up to CLIENT_TIMEOUT_S: a coordinator moving with a restarted broker, or
    still writing the markers of the id's previous transaction (a partition's task moved to another Python
    worker right after a commit: CONCURRENT_TRANSACTIONS for a few milliseconds, so the first waits are short)."""
    for attempt in Retrying(
        retry=retry_if_exception(_retriable),
        stop=stop_after_delay(CLIENT_TIMEOUT_S),
        wait=wait_exponential(multiplier=0.02, max=0.5),
        before_sleep=_trying_again(call.__name__),
        reraise=True,
    ):
        with attempt:
            call(CLIENT_TIMEOUT_S)


def with_fresh_metadata(client: Producer | Consumer, topic: str, action: Callable[[], T]) -> T:
    """Run the action; on a transient error (a partition the client does not know yet because the topic gained
    partitions since it last looked, a leader that moved with a restarted broker) refresh the client's
    metadata and run it again, for up to CLIENT_TIMEOUT_S."""

    def refresh(state: RetryCallState) -> None:
        _trying_again(topic)(state)
        try:
            client.list_topics(topic, timeout=CLIENT_TIMEOUT_S)
        except KafkaException as exc:
            if not transient(exc.args[0]):
                raise

    retrying = Retrying(
        retry=retry_if_exception(_transient),
        stop=stop_after_delay(CLIENT_TIMEOUT_S),
        wait=wait_fixed(0.5),
        before_sleep=refresh,
        reraise=True,
    )
    return retrying(action)


def last_marker(consumer: Consumer, topic: str, partition: int, writer: str) -> Marker | None:
    """The marker of the writer's last committed transaction in the partition, reading backwards from the end
    in growing steps (usually it is the last record: the first step finds it)."""
    low, end = with_fresh_metadata(
        consumer,
        topic,
        lambda: consumer.get_watermark_offsets(TopicPartition(topic, partition), timeout=CLIENT_TIMEOUT_S),
    )  # `end`: the last stable offset (read_committed)
    window, stop = 16, end
    while stop > low:
        start = max(low, stop - window)
        found = _last_marker_between(consumer, topic, partition, start, stop, writer)
        if found is not None:
            return found
        window, stop = window * 8, start
    return None


def _last_marker_between(
    consumer: Consumer, topic: str, partition: int, start: int, stop: int, writer: str
) -> Marker | None:
    consumer.assign([TopicPartition(topic, partition, start)])
    found: Marker | None = None
    try:
        while True:
            first = consumer.poll(CLIENT_TIMEOUT_S)
            if first is None:
                raise TimeoutError(
                    f"reading {topic}[{partition}] from offset {start}: nothing within {CLIENT_TIMEOUT_S:.0f}s"
                )
            # consume(n, timeout) would wait for n messages: take only what is already fetched
            for message in [first, *consumer.consume(num_messages=1000, timeout=0)]:
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        return found
                    if transient(error):  # the consumer fetches again by itself
                        continue
                    raise KafkaException(error)
                offset = message.offset()
                assert offset is not None  # a fetched record has one
                if offset >= stop:
                    return found
                marker = Marker.of(message.headers())
                if marker is not None and marker.writer == writer:
                    found = marker
    finally:
        consumer.unassign()


def tried_again(attempts: int, call: Callable[[], T], name: str) -> T:
    """`call` made again after a KafkaException, up to `attempts` times in all, waiting 0.5 s, 1 s, 2 s... up to
    5 s between; the last attempt's error is raised."""
    retrying = Retrying(
        retry=retry_if_exception_type(KafkaException),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.5, max=5.0),
        before_sleep=_trying_again(name, "writing again", logging.WARNING),
        reraise=True,
    )
    return retrying(call)
