"""Executors changed live through the control API, on a real cluster manager (Spark standalone).

The runner runs as the operator starts it: `python -m sluice.pipelines.runner runner.json`, its Spark
settings from spark-submit (here PYSPARK_SUBMIT_ARGS), everything else from the RunnerConfig.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import load_example

from sluice.api.contract import DriverStatus, ExecutorsResponse, RunnerConfig
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.local.kafka_io import produce
from sluice.pipelines.local.spark import spark_kafka_jars
from sluice.testbed.common import free_port, tail, wait_for
from sluice.testbed.spark_standalone import StandaloneCluster

TOKEN = "s3cret"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[StandaloneCluster]:
    cluster = StandaloneCluster(tmp_path_factory.mktemp("spark-standalone"), worker_cores=2, worker_memory="2g")
    try:
        yield cluster.start()
    finally:
        cluster.stop()


def submit_args(master: str) -> str:
    """What spark-submit would be given: two one-core executors at most, the driver on loopback."""
    conf = {
        "spark.executor.cores": "1",
        "spark.cores.max": "2",
        "spark.executor.memory": "512m",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.pyspark.python": sys.executable,
    }
    args = ["--master", master, "--driver-memory", "1g", "--jars", ",".join(map(str, spark_kafka_jars()))]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    return shlex.join([*args, "pyspark-shell"])


def call(method: str, url: str, body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method=method, headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


class Driver:
    def __init__(self, base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
        self.base, self.proc, self.log = base, proc, log

    def status(self) -> DriverStatus | None:
        assert self.proc.poll() is None, "runner exited: " + " | ".join(tail(self.log, 20))
        try:
            code, body = call("GET", f"{self.base}/v1/status")
        except OSError:
            return None  # not serving yet
        assert code == 200, body
        return DriverStatus.model_validate(body)

    def scale(self, target: int) -> tuple[ExecutorsResponse, DriverStatus, float]:
        """PUT the target; the response, the first status with that many executors and the seconds it took."""
        began = time.monotonic()
        code, body = call("PUT", f"{self.base}/v1/executors", json.dumps({"target": target}).encode())
        assert code == 200, body
        # A just-registered executor reports its cores a moment later: wait for its task slots too.
        status = wait_for(
            lambda: (s := self.status()) and len(s.executors) == target and s.taskSlots == target and s,
            timeout=120,
            what=f"{target} executors",
            interval=0.2,
        )
        return ExecutorsResponse.model_validate(body), status, time.monotonic() - began


@pytest.mark.kafka
@pytest.mark.spark
def test_executors_change_live_without_restarting_the_queries(
    standalone: StandaloneCluster, kafka_bootstrap: str, new_topic, tmp_path: Path
):
    app = load_example("wordcount", new_topic)
    lines = app.topics["wordcount-lines"]
    (tmp_path / "token").write_text(TOKEN)
    config = RunnerConfig(
        app="wordcount",
        revision="rev-1",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=PipelineSpec.model_validate(app.pipeline),
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=free_port(),
        controlTokenFile=str(tmp_path / "token"),
    )
    config_file = tmp_path / "runner.json"
    config_file.write_text(config.model_dump_json(by_alias=True, exclude_none=True, indent=2))
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "sluice.pipelines.runner", str(config_file)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1", "PYSPARK_SUBMIT_ARGS": submit_args(standalone.master_url)},
        )
    driver = Driver(f"http://127.0.0.1:{config.controlPort}", proc, log)
    try:

        def read(rows: int, executors: int) -> DriverStatus | None:
            """The status once the sink's query has read `rows` lines with that many executors up."""
            status = driver.status()
            read_rows = status and next(q.inputRows for q in status.queries if q.name == "out")
            return status if read_rows == rows and len(status.executors) == executors else None

        produce(kafka_bootstrap, lines, [b"a b", b"b c"], timestamps_ms=[int(time.time() * 1000)] * 2)
        before = wait_for(lambda: read(2, executors=2), timeout=300, what="2 executors and the first lines read")
        assert (before.app, before.revision, before.taskSlots, before.sourceTasks) == ("wordcount", "rev-1", 2, 4)
        assert [e.totalCores for e in before.executors] == [1, 1]
        assert before.executorTarget is None

        down, after_down, down_seconds = driver.scale(1)
        assert (down.target, down.previous, len(down.killed)) == (1, 2, 1)
        assert down.killed[0] not in [e.id for e in after_down.executors] and after_down.taskSlots == 1
        freeing = time.monotonic()
        wait_for(
            lambda: [w["coresused"] for w in standalone.alive_workers()] == [1],
            timeout=60,
            what="the master to count one executor's core",
            interval=0.2,
        )
        down_seconds += time.monotonic() - freeing
        produce(kafka_bootstrap, lines, [b"c d"], timestamps_ms=[int(time.time() * 1000)])
        wait_for(lambda: read(3, executors=1), timeout=120, what="a line read on the one executor left")

        up, after_up, up_seconds = driver.scale(2)
        assert (up.target, up.previous, up.killed) == (2, 1, [])
        assert after_up.executorTarget == 2 and after_up.taskSlots == 2

        def identity(status: DriverStatus) -> dict[str, tuple[str | None, str | None, bool, str | None]]:
            return {q.name: (q.id, q.runId, q.active, q.error) for q in status.queries}

        assert identity(after_up) == identity(before)
        assert all(active and error is None for _, _, active, error in identity(after_up).values())
        print(
            f"\nlive executors: 2 -> 1 (the master's view) in {down_seconds:.1f} s, 1 -> 2 (registered with "
            f"the driver) in {up_seconds:.1f} s"
        )
    finally:
        proc.terminate()
        try:
            code = proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert code == 0, " | ".join(tail(log, 30))
