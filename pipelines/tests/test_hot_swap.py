"""A hot swap inside a running driver (PUT /v1/pipeline), on real Kafka and Spark: only the changed query stops,
at a batch boundary, and restarts on its own checkpoint with the new plan; the other query never stops; every
record comes out once; a request that does not fit changes nothing."""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from test_control_api import call, driver_status

from sluice.api.contract import DriverStatus, QueryStep, RunnerConfig, SwapRequest
from sluice.api.pipeline import PipelineSpec
from sluice.pipelines.control.server import ControlServer
from sluice.pipelines.local.kafka_io import consume_all, produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.testbed.common import free_port, wait_for

pytestmark = [pytest.mark.kafka, pytest.mark.spark]
TOKEN = "s3cret"


def pipeline(source: str, picked: str, everything: str, condition: str) -> PipelineSpec:
    """Two queries on one source: `picked` (a filter) and `everything` (each record passed on)."""
    return PipelineSpec.model_validate(
        {
            "trigger": {"processingTime": "1s"},
            "nodes": [
                {"name": "lines", "fromKafka": {"topic": source, "format": "text", "startingOffsets": "earliest"}},
                {"name": "kept", "inputs": ["lines"], "filter": condition},
                {"name": "picked", "inputs": ["kept"], "toKafka": {"topic": picked, "value": "value"}},
                {"name": "everything", "inputs": ["lines"], "toKafka": {"topic": everything, "value": "value"}},
            ],
        }
    )


def values(bootstrap: str, topic: str, expected: int, settle: float = 3.0) -> Counter[str]:
    """Everything in the topic once `expected` records arrived and `settle` seconds more passed (a duplicate
    written a moment later is counted)."""
    consume_all(bootstrap, topic, expected=expected, timeout_s=120)
    time.sleep(settle)
    return Counter(r.value.decode() for r in consume_all(bootstrap, topic))


def swap(base: str, request: SwapRequest | dict[str, Any]) -> tuple[int, Any]:
    body = request.model_dump_json() if isinstance(request, SwapRequest) else json.dumps(request)
    return call("PUT", f"{base}/v1/pipeline", body.encode(), token=TOKEN)


def threads_and_files() -> tuple[int, int]:
    """This process's threads (Python's and native ones) and open files."""
    status = Path("/proc/self/status").read_text().splitlines()
    threads = int(next(line.split()[1] for line in status if line.startswith("Threads:")))
    return threads, len(os.listdir("/proc/self/fd"))


def runs(status: DriverStatus) -> dict[str, tuple[str | None, str | None, str | None]]:
    return {q.name: (q.id, q.runId, q.revision) for q in status.queries}


def test_a_filter_change_restarts_only_its_query(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic, tmp_path: Path
) -> None:
    source, picked, everything = new_topic(2), new_topic(1), new_topic(1)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = RunnerConfig(
        app="swap",
        revision="rev-1",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=pipeline(source, picked, everything, "value LIKE 'a%'"),
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=free_port(),
        controlTokenFile=str(token),
    )
    first = [f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20)]
    produce(kafka_bootstrap, source, [v.encode() for v in first])
    run = PipelineRun(spark_session, config).start()
    server = ControlServer(run).start()
    base = f"http://127.0.0.1:{server.port}"
    try:
        assert values(kafka_bootstrap, picked, 20) == Counter(f"a{i}" for i in range(20))
        before = runs(driver_status(base))
        assert {name: revision for name, (_, _, revision) in before.items()} == {
            "picked": "rev-1",
            "everything": "rev-1",
        }
        new = config.model_copy(
            update={"revision": "rev-2", "pipeline": pipeline(source, picked, everything, "value LIKE 'b%'")}
        )
        steps = [QueryStep(name="picked", action="restart"), QueryStep(name="everything", action="keep")]

        # Requests that do not fit change nothing.
        broken = new.model_copy(update={"pipeline": pipeline(source, picked, everything, "nope LIKE 'b%'")})
        code, body = swap(base, SwapRequest(config=broken, steps=steps))
        assert code == 422 and body["field"].startswith("config.pipeline.nodes[1]"), body
        code, body = swap(base, SwapRequest(config=new, steps=steps[:1]))
        assert (code, body["field"]) == (409, "steps") and "everything" in body["error"]
        code, body = swap(base, SwapRequest(config=new, steps=[QueryStep(name="picked", action="migrate"), steps[1]]))
        assert (code, body["field"]) == (409, "steps[0].action")
        code, body = swap(
            base, SwapRequest(config=new.model_copy(update={"checkpointRoot": "/elsewhere"}), steps=steps)
        )
        assert (code, body["field"]) == (409, "config.checkpointRoot")
        code, body = swap(base, {"config": new.model_dump(), "steps": [{"name": "picked", "action": "later"}]})
        assert (code, body["field"]) == (400, "steps[0].action")
        assert call("PUT", f"{base}/v1/pipeline", b"{}")[0] == 401
        assert runs(driver_status(base)) == before

        code, body = swap(base, SwapRequest(config=new, steps=steps))
        assert code == 200, body
        assert 0 <= body.pop("tookMs") < 60_000, "the pause of the changed queries"
        assert body == {
            "revision": "rev-2",
            "restarted": ["picked"],
            "moved": [],
            "started": [],
            "stopped": [],
            "kept": ["everything"],
        }
        after = runs(driver_status(base))
        assert after["everything"] == before["everything"], "a kept query never stops"
        assert after["picked"][0] == before["picked"][0], "the same checkpoint (query id)"
        assert after["picked"][1] != before["picked"][1] and after["picked"][2] == "rev-2"
        code, body = swap(base, SwapRequest(config=new, steps=steps))  # asked again (a retried request): no change
        assert (code, body["restarted"], sorted(body["kept"])) == (200, [], ["everything", "picked"]), body
        assert runs(driver_status(base)) == after

        later = [f"a{i}" for i in range(20, 30)] + [f"b{i}" for i in range(20, 30)]
        time.sleep(1)
        produce(kafka_bootstrap, source, [v.encode() for v in later])
        out = values(kafka_bootstrap, picked, 30)
        everything_out = values(kafka_bootstrap, everything, len(first) + len(later))
        wait_for(lambda: all(q.runBatches for q in driver_status(base).queries), what="batches on the new plan")
        by_name = {q.name: q for q in driver_status(base).queries}
        assert by_name["picked"].runBatches < by_name["picked"].batches, "a new run counts its own batches"
        assert by_name["everything"].runBatches == by_name["everything"].batches
    finally:
        server.stop()
        run.stop()

    # What the old plan read stays its own: the new one continues from the checkpointed offsets.
    assert out == Counter([f"a{i}" for i in range(20)] + [f"b{i}" for i in range(20, 30)])
    assert everything_out == Counter(first + later)


def test_a_restarted_query_leaves_no_thread_nor_file_behind(
    spark_session: SparkSession, kafka_bootstrap: str, new_topic, tmp_path: Path
) -> None:
    """Each run of a query calls its batches from a new JVM thread, on a connection of its own to the driver's
    Python. One left open per restart was a thread and a socket more for as long as the driver lived (the soak's
    runner gained about 2 threads and 2-3 files at each rollout; 8 restarts here added 9 of each before the fix).
    One more of each may come once: the JVM thread that tells Python which of its objects the JVM collected opens
    its connection the first time its GC drops one (here after the 6th restart or so), and keeps it."""
    source, picked, everything = new_topic(1), new_topic(1), new_topic(1)
    config = RunnerConfig(
        app="swap-leak",
        revision="rev-0",
        kafkaBootstrap=kafka_bootstrap,
        pipeline=pipeline(source, picked, everything, "value LIKE 'a%'"),
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=0,
    )
    steps = [QueryStep(name="picked", action="restart"), QueryStep(name="everything", action="keep")]
    run = PipelineRun(spark_session, config).start()
    try:

        def restart_and_write(revision: int) -> None:
            """A swap restarts `picked`; a record then makes its new run call a batch."""
            if revision:
                condition = f"value LIKE 'a%' AND value != 'never-{revision}'"
                new = config.model_copy(
                    update={"revision": f"rev-{revision}", "pipeline": pipeline(source, picked, everything, condition)}
                )
                assert run.swap(new, steps).restarted == ["picked"]
            produce(kafka_bootstrap, source, [f"a{revision}".encode()])
            consume_all(kafka_bootstrap, picked, expected=revision + 1, timeout_s=120)

        restart_and_write(0)
        restart_and_write(1)  # whatever a first restart starts and keeps is there now
        before = threads_and_files()
        restarts = 8
        for revision in range(2, 2 + restarts):
            restart_and_write(revision)
        bound = (before[0] + 1, before[1] + 1)  # the collector's connection, once
        deadline = time.monotonic() + 30  # threads of the swaps and the Kafka reads end
        after = threads_and_files()
        while (after[0] > bound[0] or after[1] > bound[1]) and time.monotonic() < deadline:
            time.sleep(0.5)
            after = threads_and_files()
        grown = f"threads, files: {before} -> {after} in {restarts} restarts"
        assert after[0] <= bound[0] and after[1] <= bound[1], grown
    finally:
        run.stop()
