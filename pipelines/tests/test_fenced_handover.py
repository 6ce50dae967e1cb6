"""A fenced handover between two drivers (PUT /v1/state), on real Kafka and Spark: a second driver, its own
JVM, starts on standby beside the running one and touches nothing; the old one drains at a batch boundary and
stays up; the new one goes on from the same checkpoint (the windows' state included) and every window comes out
exactly once while events stream in the whole time."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from pyspark.sql import SparkSession
from test_control_api import call, driver_status
from test_migration import WATERMARK_MS, first_revision, pipeline, send, windows, written

from sluice.api.contract import DriverStatus, QueryStep, RunnerConfig, SwapRequest
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.control.server import ControlServer
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.testbed.common import free_port, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
TOKEN = "s3cret"
WINDOW_MS = 2_000


class LiveEvents:
    """Events at the time they are sent, a few per 100 ms, until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.bootstrap, self.topic = bootstrap, topic
        self.sent: list[tuple[int, str]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> LiveEvents:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            now = int(time.time() * 1000)
            self.sent += send(self.bootstrap, self.topic, [now, now + 1, now + 2])

    def stop(self) -> list[tuple[int, str]]:
        """What was sent (stopping again returns the same)."""
        self._stop.set()
        self._thread.join()
        return self.sent


def set_state(base: str, state: str) -> tuple[int, dict]:
    return call("PUT", f"{base}/v1/state", f'{{"state": "{state}"}}'.encode(), token=TOKEN)


def state_of(base: str) -> DriverStatus | None:
    try:
        return driver_status(base)
    except OSError:
        return None  # not answering yet


def test_a_standby_driver_takes_over_from_a_drained_one_exactly_once(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic, tmp_path: Path
) -> None:
    source, out = new_topic(2), new_topic(1)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    old_config = RunnerConfig(
        app="handover",
        revision="rev-1",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=pipeline(source, out, f"{WINDOW_MS // 1000}s"),
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=free_port(),
        controlTokenFile=str(token),
    )
    new_config = old_config.model_copy(update={"revision": "rev-2", "standby": True, "controlPort": free_port()})
    new_file = tmp_path / "runner.json"
    new_file.write_text(new_config.model_dump_json(by_alias=True, exclude_none=True))
    events = LiveEvents(kafka_bootstrap, source).start()
    old = PipelineRun(spark_session, old_config).start()
    server = ControlServer(old).start()
    old_base, new_base = f"http://127.0.0.1:{old_config.controlPort}", f"http://127.0.0.1:{new_config.controlPort}"
    log = (tmp_path / "new-driver.log").open("w")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable}
    new = subprocess.Popen(
        [sys.executable, "-m", "sluice.pipelines.runner", str(new_file), "--master", "local[1]"],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        wait_for(lambda: written(kafka_bootstrap, out) or None, timeout=120, what="the old driver's first windows")
        standby = wait_for(lambda: state_of(new_base), timeout=180, what="the new driver's control API")
        assert (standby.state, standby.revision, standby.queries) == ("standby", "rev-2", [])
        assert not (tmp_path / "chk" / "counts" / "offsets" / "0.tmp").exists()
        before = len(os.listdir(tmp_path / "chk" / "counts" / "offsets"))
        time.sleep(3)
        assert len(os.listdir(tmp_path / "chk" / "counts" / "offsets")) > before, "the old driver goes on meanwhile"
        new_swap = SwapRequest(config=new_config, steps=[QueryStep(name="counts", action="keep")])
        code, body = call("PUT", f"{new_base}/v1/pipeline", new_swap.model_dump_json().encode(), token=TOKEN)
        assert code == 409 and "standby" in body["error"], body
        assert set_state(new_base, "later")[0] == 400
        assert call("PUT", f"{new_base}/v1/state", b'{"state": "running"}')[0] == 401

        code, drained = set_state(old_base, "drained")
        assert code == 200 and (drained["previous"], drained["state"], drained["stopped"]) == (
            "running",
            "drained",
            ["counts"],
        ), drained
        assert set_state(old_base, "drained")[1]["stopped"] == [], "asked twice, the second changes nothing"
        assert driver_status(old_base).state == "drained" and old.healthy() and old.queries == []
        code, active = set_state(new_base, "running")
        assert code == 200 and (active["previous"], active["state"], active["started"]) == (
            "standby",
            "running",
            ["counts"],
        ), active
        running = wait_for(
            lambda: next((s for s in [driver_status(new_base)] if s.queries and s.queries[0].runBatches >= 2), None),
            timeout=120,
            what="the new driver's batches",
        )
        assert running.state == "running" and running.queries[0].revision == "rev-2"
        time.sleep(3)
        sent = events.stop()
        flush = max(t for t, _ in sent) + 3 * WINDOW_MS + WATERMARK_MS
        sent += send(kafka_bootstrap, source, [flush])
        closed = {w: n for w, n in windows(sent, WINDOW_MS).items() if w[1] + WINDOW_MS <= flush - WATERMARK_MS}
        got = wait_for(
            lambda: (lambda w: w if set(w) >= set(closed) else None)(written(kafka_bootstrap, out)),
            timeout=120,
            what="every closed window",
        )
        twice = {w: n for w, n in got.items() if len(n) > 1}
        assert twice == {}, f"windows written twice: {sorted(twice)[:5]}"
        assert {w: n[0] for w, n in got.items()} == closed, "every window once, with every event counted"
        assert len(closed) > 20, "windows before, across and after the handover"
    finally:
        events.stop()
        new.terminate()
        try:
            new.wait(timeout=60)
        except subprocess.TimeoutExpired:
            new.kill()
        log.close()
        server.stop()
        old.stop()


def test_a_drain_stops_the_dead_letter_queries_before_the_queries_they_wait_for() -> None:
    class Query:
        def __init__(self, name: str) -> None:
            self.name = name

    stopped: list[str] = []
    lock = threading.Lock()

    def stop(query: Query) -> None:
        time.sleep(0.05 if query.name == "seen" else 0)
        with lock:
            stopped.append(query.name)

    queries = [Query("out"), Query("seen"), Query("lines-dead-letters"), Query("clicks-dead-letters")]
    PipelineRun._stop_all(queries, stop)  # type: ignore[arg-type]
    assert sorted(stopped[:2]) == ["clicks-dead-letters", "lines-dead-letters"]
    assert sorted(stopped[2:]) == ["out", "seen"]


def test_a_plan_that_fails_on_its_records_still_goes_on_standby(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The warm-up runs the plan over the last records: one that fails there is told, and the driver waits on
    standby all the same (its first batch fails once it is activated, and the rollout rolls back)."""
    source, out = new_topic(1), new_topic(1)
    spec = pipeline(source, out, "2s").model_dump(mode="json", exclude_none=True)
    spec["nodes"][1]["inputs"] = ["checked"]
    spec["nodes"].insert(
        1, {"name": "checked", "inputs": ["events"], "filter": "raise_error(concat('bad word ', word)) IS NULL"}
    )
    config = first_revision(PipelineSpec.model_validate(spec), kafka_bootstrap, tmp_path).model_copy(
        update={"revision": "rev-2", "standby": True}
    )
    events = LiveEvents(kafka_bootstrap, source).start()  # records in the warm-up's last seconds, whenever it runs
    wait_for(lambda: events.sent or None, timeout=30, what="the first events in Kafka")
    run = PipelineRun(spark_session, config)
    try:
        run.start()
        assert run.state == "standby" and run.queries == []
        told = [r.getMessage() for r in caplog.records if "warm-up" in r.getMessage()]
        assert any("warm-up of query counts failed" in m and "bad word" in m for m in told), told
        run.set_state("running")
        failed = wait_for(lambda: run.failed() or None, timeout=120, what="the first batch failing")
        assert failed[0].name == "counts" and "bad word" in (failed[0].error or "")
    finally:
        events.stop()
        run.stop()
