"""The side-by-side benchmark's harness (pipelines/bench/bench_peers.py). Its output watch, on a real broker: in a
throughput run of the stateless workload it only counts the output while the job runs, and checks the whole output
once the job has stopped, so a wrong or duplicated record still fails the run. Which settings a system's latency
runs sweep."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from bench_peers import SYSTEMS, OutputWatch
from confluent_kafka import Producer
from peer_workloads import FILTER_PROJECTION, FREQUENCY_COUNT, Reference

WORDS = [b"lengthy", b"short", b"streaming", b"kafka", b"exactly", b"once"]


def projection_reference() -> Reference:
    reference = Reference(FILTER_PROJECTION)
    reference.add((f"id-{i}".encode(), word, 0) for i, word in enumerate(WORDS * 50))
    return reference


def produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    for key, value in records:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(30) == 0


def watched_output(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> Any:
    reference = projection_reference()
    watch = OutputWatch(bootstrap, topic, keep_arrivals=False).expect(reference)
    produce(bootstrap, topic, records)
    assert watch.done.wait(60), "the count never reached the reference's outputs"
    return watch.finish(timeout=120)


@pytest.mark.kafka
def test_a_right_output_completes_and_passes_the_check(kafka_bootstrap: str, new_topic: Callable[..., str]) -> None:
    expected = sorted(projection_reference().projected.items())
    watched = watched_output(kafka_bootstrap, new_topic(partitions=4), expected)
    assert watched.complete_at is not None
    assert (watched.errors, watched.outputs) == ([], len(expected))


@pytest.mark.kafka
def test_a_wrong_or_duplicated_record_fails_the_check_after_the_count(
    kafka_bootstrap: str, new_topic: Callable[..., str]
) -> None:
    expected = sorted(projection_reference().projected.items())
    (first_key, _), *rest = expected
    wrong = [(first_key, b"NOT-THE-WORD"), *rest, rest[0]]  # one value wrong, one record twice
    watched = watched_output(kafka_bootstrap, new_topic(partitions=4), wrong)
    assert watched.complete_at is not None  # the count reached it: only the check can tell
    assert watched.errors == ["1 duplicate output records", "1 records not in the input or with a wrong value"]


def test_latency_sweeps_only_settings_that_change_the_workload() -> None:
    systems = {system.name: system for system in SYSTEMS}
    assert systems["pyflink-eos"].swept(FILTER_PROJECTION) == ("250 ms", "500 ms", "1 s", "2 s")  # commits: always
    assert systems["pyflink"].swept(FREQUENCY_COUNT) == ("100 ms", "250 ms", "500 ms")
    assert systems["pyflink"].swept(FILTER_PROJECTION) == ()  # no aggregation: mini-batch does nothing
    assert systems["sluice"].swept(FREQUENCY_COUNT) == ()
