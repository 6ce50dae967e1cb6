"""The exactly-once sink's retries (kafka_eos/transactions.py, on tenacity), with calls that fail as librdkafka
does, and the clients it keeps between batches; the sink's real retries under broker restarts are in
test_faults.py and test_kafka_eos*.py."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from sluice.pipelines.sinks.kafka_eos import transactions
from sluice.pipelines.sinks.kafka_eos.transactions import retried, tried_again, with_fresh_metadata
from sluice.pipelines.sinks.kafka_eos.writer import kept_admin, release_kept_clients


def kafka_error(code: int, retriable: bool = False) -> KafkaException:
    return KafkaException(KafkaError(code, "as librdkafka says", retriable=retriable))


class Failing:
    """Raises the given errors in turn, then returns 'done'."""

    def __init__(self, *errors: Exception) -> None:
        self.errors, self.calls = list(errors), 0
        self.__name__ = "commit_transaction"

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "done"


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tenacity.nap.time.sleep", lambda seconds: None)


def test_a_retriable_error_is_tried_again_and_another_is_raised_at_once() -> None:
    call = Failing(
        kafka_error(KafkaError.CONCURRENT_TRANSACTIONS, retriable=True), kafka_error(KafkaError._TRANSPORT, True)
    )
    retried(call)
    assert call.calls == 3
    fenced = Failing(kafka_error(KafkaError._FENCED))
    with pytest.raises(KafkaException) as raised:
        retried(fenced)
    assert fenced.calls == 1 and raised.value.args[0].code() == KafkaError._FENCED


def test_a_retriable_error_past_the_client_timeout_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transactions, "CLIENT_TIMEOUT_S", 0.0)
    call = Failing(*[kafka_error(KafkaError._TRANSPORT, retriable=True)] * 3)
    with pytest.raises(KafkaException):
        retried(call)
    assert call.calls == 1


class Client:
    def __init__(self) -> None:
        self.refreshed = 0

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed += 1


def test_a_transient_error_refreshes_the_metadata_before_the_next_try() -> None:
    client = Client()
    action = Failing(kafka_error(KafkaError._UNKNOWN_PARTITION), kafka_error(KafkaError.NOT_LEADER_FOR_PARTITION))
    assert with_fresh_metadata(client, "out", action) == "done"  # type: ignore[arg-type]
    assert (action.calls, client.refreshed) == (3, 2)
    broken = Failing(kafka_error(KafkaError.TOPIC_AUTHORIZATION_FAILED))
    with pytest.raises(KafkaException):
        with_fresh_metadata(client, "out", broken)  # type: ignore[arg-type]
    assert (broken.calls, client.refreshed) == (1, 2)


def test_a_driver_write_is_tried_a_set_number_of_times_and_the_last_error_raised() -> None:
    twice = Failing(kafka_error(KafkaError._TRANSPORT))
    assert tried_again(3, twice, "out[0]") == "done" and twice.calls == 2
    always = Failing(*(kafka_error(KafkaError._TRANSPORT, True) for _ in range(2)), kafka_error(KafkaError._FENCED))
    with pytest.raises(KafkaException) as raised:
        tried_again(3, always, "out[0]")
    assert always.calls == 3 and raised.value.args[0].code() == KafkaError._FENCED


def test_the_admin_client_is_kept_between_batches_until_the_clients_are_released() -> None:
    """A new admin client per batch cost each exactly-once batch a connection (and with TLS and SASL a handshake
    and a login) before the partition count came back."""
    config = {"bootstrap.servers": "127.0.0.1:1", "log_level": 0}
    first = kept_admin(config)
    assert kept_admin(dict(config)) is first, "the same config: the same client"
    assert kept_admin({**config, "client.id": "other"}) is not first
    release_kept_clients(timeout=5)
    assert kept_admin(config) is not first, "released with the driver's other clients"
    release_kept_clients(timeout=5)
