"""pytest plugin: session-scoped real Kafka and Spark, always torn down (loaded via -p in pyproject)."""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator

import pytest

from sluice.pipelines.local.kafka import KafkaCluster, SecuredListener
from sluice.pipelines.local.kafka_io import create_topic

from .kafka_security import secured_listener

SCRAM_USERS = ("sluice-app", "sluice-operator")


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """A single-node KRaft broker on free loopback ports: plaintext, and SASL_SSL with SCRAM_USERS."""
    state = tmp_path_factory.mktemp("kafka")
    listener = secured_listener(state / "pki", ["127.0.0.1", "localhost"], SCRAM_USERS)
    cluster = KafkaCluster.on_free_ports(state, secured=listener)
    try:
        yield cluster.start()
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: KafkaCluster) -> str:
    return kafka_broker.bootstrap


@pytest.fixture(scope="session")
def kafka_secured(kafka_broker: KafkaCluster) -> SecuredListener:
    assert kafka_broker.secured is not None
    return kafka_broker.secured


_topic_numbers = itertools.count()


@pytest.fixture
def new_topic(kafka_bootstrap: str, request: pytest.FixtureRequest) -> Callable[..., str]:
    """Factory for a fresh, uniquely named topic: new_topic(partitions=1) -> name."""

    def make(partitions: int = 1, prefix: str | None = None) -> str:
        base = prefix or request.node.name.replace("[", "-").replace("]", "").lower()[:80]
        name = f"{base}-{os.getpid()}-{next(_topic_numbers)}"
        create_topic(kafka_bootstrap, name, partitions)
        return name

    return make


@pytest.fixture(scope="session")
def spark_session():
    """A local Spark session with the Kafka connector on the classpath (nothing fetched at query time)."""
    from sluice.pipelines.local.spark import spark_kafka_jars
    from sluice.pipelines.session import local_session

    session = local_session("sluice-tests", spark_kafka_jars(), cores=2, shuffle_partitions=2)
    try:
        yield session
    finally:
        session.stop()


OPT_IN_MARKERS = ("bench", "faults", "e2e_local", "kind", "soak", "overload")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Benchmarks, the long fault runs and the local-cluster e2e run only when asked for (`make bench` =
    `pytest -m bench …`, `make faults` = `pytest -m faults …`, `make e2e-local` = `pytest -m e2e_local …`,
    `make test-kind` = `pytest -m kind …`):
    they take many minutes (benchmarks report figures rather than pass/fail on speed), so the test suite
    leaves them out; .ci/run runs the e2e after `make test`."""
    asked = config.getoption("markexpr") or ""
    for marker in OPT_IN_MARKERS:
        if marker in asked:
            continue
        left_out = [item for item in items if item.get_closest_marker(marker) is not None]
        if left_out:
            config.hook.pytest_deselected(items=left_out)
            items[:] = [item for item in items if item.get_closest_marker(marker) is None]
