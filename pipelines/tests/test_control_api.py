"""The driver control API: bearer token and request bodies (pure), then the API of a real running pipeline."""

from __future__ import annotations

import itertools
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers import load_example
from pyspark.sql import SparkSession

from sluice.api.contract import DriverStatus, ExecutorsRequest, RunnerConfig, TopicStatus
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.control.auth import NO_TOKEN, ControlToken, bearer_token
from sluice.pipelines.control.errors import ApiFailure
from sluice.pipelines.control.server import ControlServer, parse_request
from sluice.pipelines.local.kafka_io import produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.testbed.common import free_port, wait_for

LOCAL_MODE = "executor scaling needs a cluster manager (this driver runs Spark in local mode)"


# ------------------------------------------------------------------------------------ token


def test_bearer_token_of_the_authorization_header():
    assert bearer_token("Bearer abc") == "abc"
    assert bearer_token("bearer   abc  ") == "abc"
    assert bearer_token("Basic abc") is None
    assert bearer_token("Bearer") is None
    assert bearer_token("") is None
    assert bearer_token(None) is None


def refused(token: ControlToken, header: str | None) -> tuple[int, str] | None:
    try:
        token.check(header)
    except ApiFailure as failure:
        return failure.status, failure.error.error
    return None


def test_token_from_its_file_reread_when_it_changes(tmp_path: Path):
    path = tmp_path / "token"
    path.write_text("first-token\n")
    token = ControlToken(str(path))
    assert refused(token, "Bearer first-token") is None
    assert refused(token, "Bearer first-tokenX") == (401, "missing or wrong bearer token")
    assert refused(token, "Bearer ") == (401, "missing or wrong bearer token")
    assert refused(token, None) == (401, "missing or wrong bearer token")
    path.write_text("second")  # Kubernetes rotated the Secret
    assert refused(token, "Bearer first-token") == (401, "missing or wrong bearer token")
    assert refused(token, "Bearer second") is None


def test_no_token_file_disables_writes(tmp_path: Path):
    assert refused(ControlToken(None), "Bearer anything") == (403, NO_TOKEN)
    assert NO_TOKEN == "writes are disabled: no control token"
    status, message = refused(ControlToken(str(tmp_path / "missing")), "Bearer anything") or (0, "")
    assert status == 403 and message.startswith(NO_TOKEN) and "missing" in message
    empty = tmp_path / "empty"
    empty.write_text("  \n")
    assert refused(ControlToken(str(empty)), "Bearer ") == (403, f"{NO_TOKEN}: {empty} is empty")


# ------------------------------------------------------------------------------------ bodies


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (b'{"target": "2"}', "target"),
        (b'{"target": 2.0}', "target"),
        (b'{"target": true}', "target"),
        (b'{"target": -1}', "target"),
        (b'{"target": 1001}', "target"),
        (b"{}", "target"),
        (b'{"target": 2, "force": true}', "force"),
        (b"[2]", None),
        (b"{", None),
        (b"", None),
        (b"\xff\xfe", None),
    ],
)
def test_bad_executor_requests_name_the_field(body: bytes, field: str | None):
    with pytest.raises(ApiFailure) as info:
        parse_request(ExecutorsRequest, body, '{"target": N}')
    assert (info.value.status, info.value.error.field) == (400, field)
    assert info.value.error.error.startswith(f"{field}: " if field else "")


def test_good_executor_requests():
    assert parse_request(ExecutorsRequest, b'{"target": 0}', "") == ExecutorsRequest(target=0)
    assert parse_request(ExecutorsRequest, b' {"target": 1000} ', "") == ExecutorsRequest(target=1000)


# ------------------------------------------------------------------------------ a real driver


def call(method: str, url: str, body: bytes | None = None, token: str | None = None) -> tuple[int, Any]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(url, data=body, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            status, raw = response.status, response.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode()


def driver_status(base: str) -> DriverStatus:
    status, body = call("GET", f"{base}/v1/status")
    assert status == 200, body
    return DriverStatus.model_validate(body)


@pytest.mark.kafka
@pytest.mark.spark
def test_control_api_of_a_running_pipeline(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic, tmp_path: Path
):
    app = load_example("wordcount", new_topic)
    app.node("lines")["fromKafka"]["maxRecordsPerTrigger"] = 10
    # The first batch starts at once, the next one at the next whole day: what the first batch left stays.
    app.pipeline["trigger"] = {"processingTime": "1d"}
    lines = app.topics["wordcount-lines"]
    produced = 100
    produce(
        kafka_bootstrap,
        lines,
        [f"word{i}".encode() for i in range(produced)],
        timestamps_ms=[int(time.time() * 1000) - 60_000] * produced,
    )
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    config = RunnerConfig(
        app="wordcount",
        revision="rev-1",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=PipelineSpec.model_validate(app.pipeline),
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=free_port(),
        controlTokenFile=str(token),
    )
    run = PipelineRun(spark_session, config).start()
    server = ControlServer(run).start()
    base = f"http://127.0.0.1:{server.port}"
    try:

        def after_first_batches() -> DriverStatus | None:
            run.raise_if_failed()
            status = driver_status(base)
            return status if len(status.queries) == 2 and all(q.batches for q in status.queries) else None

        status = wait_for(after_first_batches, timeout=240, what="the first batch of both queries")
        queries = {q.name: q for q in status.queries}
        assert set(queries) == {"out", "lines-dead-letters"}
        for query in run.queries:
            reported = queries[query.name]
            assert (reported.id, reported.runId, reported.active, reported.error) == (query.id, query.runId, True, None)
            assert reported.batchId == 0 and reported.batches == 1 and 0 < reported.inputRows < produced
            assert reported.topics == [lines] and reported.triggerIntervalMs == 86_400_000
            assert reported.lastBatchDurationMs is not None and reported.busyMs > 0
        assert queries["out"].stateful and not queries["lines-dead-letters"].stateful
        # one (window, word) per record read: every line is a distinct word, all in one window
        assert queries["out"].stateRows == queries["out"].inputRows and queries["lines-dead-letters"].stateRows is None
        assert queries["out"].watermark is not None, "Spark reports the epoch before the watermark first advances"

        # Both queries read the topic: it counts once, behind the query that read less.
        backlog = produced - min(q.inputRows for q in status.queries)
        assert status.topics == [TopicStatus(topic=lines, partitions=4, latestOffsets=produced, backlog=backlog)]
        assert status.backlog == backlog and status.latestOffsetsFrom == "kafka"
        assert (status.app, status.revision, status.executors, status.executorTarget) == (
            "wordcount",
            "rev-1",
            [],
            None,
        )
        assert (status.taskSlots, status.sourceTasks, status.shufflePartitions) == (2, 4, 2)

        code, metrics = call("GET", f"{base}/metrics")
        assert code == 200
        assert f'sluice_kafka_backlog_records{{app="wordcount",topic="{lines}"}} {float(backlog)}' in metrics
        # Records arriving after the last batch: the series counts them as the status does, against Kafka's end
        # offsets at the scrape (the last progress alone would still say the backlog it planned).
        produce(kafka_bootstrap, lines, [b"late"] * 7)
        time.sleep(1.1)  # past LatestOffsets' cache
        code, metrics = call("GET", f"{base}/metrics")
        assert f'sluice_kafka_backlog_records{{app="wordcount",topic="{lines}"}} {float(backlog + 7)}' in metrics
        assert 'sluice_input_rows_per_second{app="wordcount",query="out"}' in metrics
        assert 'sluice_executors{app="wordcount"} 0.0' in metrics
        code, health = call("GET", f"{base}/healthz")
        assert code == 200 and health["healthy"] is True

        scale = f"{base}/v1/executors"
        assert call("PUT", scale, b'{"target": 3}') == (401, {"error": "missing or wrong bearer token", "field": None})
        assert call("PUT", scale, b'{"target": 3}', token="wrong")[0] == 401
        assert call("PUT", scale, b'{"target": "3"}', token="s3cret") == (
            400,
            {"error": "target: Input should be a valid integer", "field": "target"},
        )
        assert call("PUT", scale, b'{"target": -1}', token="s3cret")[1]["field"] == "target"
        assert call("PUT", scale, b'{"target": 3, "now": 1}', token="s3cret")[1]["field"] == "now"
        assert call("PUT", scale, b"target=3", token="s3cret")[0] == 400
        assert call("PUT", scale, b'{"target": 3}', token="s3cret") == (409, {"error": LOCAL_MODE, "field": None})
        token.write_text("rotated")
        assert call("PUT", scale, b'{"target": 3}', token="s3cret")[0] == 401
        assert call("PUT", scale, b'{"target": 3}', token="rotated")[0] == 409
        assert driver_status(base).executorTarget is None  # nothing changed

        checkpoints = f"{base}/v1/checkpoints"
        assert call("DELETE", checkpoints, b'{"checkpoints": ["out"]}')[0] == 401
        assert call("DELETE", checkpoints, b'{"checkpoints": ["out"]}', token="rotated") == (
            409,
            {"error": "checkpoint out: query out runs on it", "field": "checkpoints"},
        )
        assert call("DELETE", checkpoints, b'{"checkpoints": ["../etc"]}', token="rotated")[1]["field"] == (
            "checkpoints[0]"
        )
        assert call("DELETE", checkpoints, b'{"checkpoints": []}', token="rotated")[1]["field"] == "checkpoints"
        assert (tmp_path / "chk" / "out").is_dir(), "a refused delete deletes nothing"
        (tmp_path / "chk" / "out@rev-0").mkdir()
        assert call("DELETE", checkpoints, b'{"checkpoints": ["out@rev-0", "gone"]}', token="rotated") == (
            200,
            {"deleted": ["out@rev-0"], "absent": ["gone"]},
        )
        assert not (tmp_path / "chk" / "out@rev-0").exists()

        assert call("GET", scale)[0] == 405
        assert call("POST", f"{base}/v1/status", b"{}")[0] == 405
        assert call("GET", f"{base}/v1/nope")[0] == 404
        with socket.create_connection(("127.0.0.1", server.port), timeout=10) as raw:
            raw.sendall(b"\x00\x01 garbage \r\n\r\n")
            raw.recv(1024)
        assert call("GET", f"{base}/healthz")[0] == 200  # still serving
    finally:
        server.stop()
        run.stop()


SLOW = "aggregate(sequence(1, 1000000 + length(value)), 0L, (acc, x) -> acc + x)"  # ~0.1 s a record here


@pytest.mark.kafka
@pytest.mark.spark
def test_status_during_a_long_batch_shows_the_backlog_and_the_busy_time_growing(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic, tmp_path: Path
):
    topic = new_topic(partitions=1)
    pipeline = {
        "trigger": {"processingTime": "1s"},
        "nodes": [
            {"name": "src", "fromKafka": {"topic": topic}},
            {"name": "slow", "inputs": ["src"], "select": [f"{SLOW} AS work"]},
            {"name": "out", "inputs": ["slow"], "toMemory": {"table": "slow_batches"}},
        ],
    }
    config = RunnerConfig(
        app="slow",
        revision="rev-1",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=PipelineSpec.model_validate(pipeline),
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=free_port(),
    )
    produce(kafka_bootstrap, topic, [b"first"])
    run = PipelineRun(spark_session, config).start()
    server = ControlServer(run).start()
    base = f"http://127.0.0.1:{server.port}"
    arriving = threading.Event()

    def trickle() -> None:  # records keep arriving while the long batch runs
        while not arriving.wait(0.25):
            produce(kafka_bootstrap, topic, [b"later"])

    try:

        def after_first_batch() -> DriverStatus | None:
            run.raise_if_failed()
            status = driver_status(base)
            return status if status.queries and status.queries[0].batches >= 1 else None

        first = wait_for(after_first_batch, timeout=240, what="the first batch")
        assert first.latestOffsetsFrom == "kafka" and first.latestOffsetsError is None
        produce(kafka_bootstrap, topic, [b"x"] * 100)  # the next batch reads them all: ~10 s
        producer = threading.Thread(target=trickle, daemon=True)
        producer.start()

        def running_long() -> DriverStatus | None:
            run.raise_if_failed()
            status = driver_status(base)
            return status if status.queries[0].runningBatchMs >= 1_000 else None

        during = [wait_for(running_long, timeout=120, what="a batch running for a second")]
        for _ in range(3):
            time.sleep(1.5)
            during.append(driver_status(base))
        # All four readings fell within that one batch: it completed none meanwhile.
        assert {s.queries[0].batches for s in during} == {during[0].queries[0].batches}
        assert all(s.queries[0].runningBatchMs > 0 and s.latestOffsetsFrom == "kafka" for s in during)
        for before, after in itertools.pairwise(during):
            wall_ms = datetime.fromisoformat(after.observedAt) - datetime.fromisoformat(before.observedAt)
            busy_ms = after.queries[0].busyMs - before.queries[0].busyMs
            assert abs(busy_ms - wall_ms.total_seconds() * 1000) <= 20, (busy_ms, wall_ms)
            assert after.backlog > before.backlog  # what arrives shows now, not when the batch is over
            assert after.topics[0].latestOffsets > before.topics[0].latestOffsets
        query = during[-1].queries[0]
        assert query.busyMs == query.completedBusyMs + query.runningBatchMs
    finally:
        arriving.set()
        server.stop()
        run.stop()
