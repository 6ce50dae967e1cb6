"""What Spark's analyser refuses as a query starts (output modes, operator order) is found without starting
anything, and reported at the query's sink node by `sluice validate` and by the runner alike (issue 14 §3)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLE_NAMES, EXAMPLES, REPO_ROOT

from sluice.api.contract import RunnerConfig
from sluice.api.validation import PipelineInvalid, Problem, load_documents, validate
from sluice.pipelines.compiler import compile_pipeline
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.pipelines.plancheck import plan_problems, stand_in_frames, streaming_problems
from sluice.pipelines.runner import termination_message

pytestmark = pytest.mark.spark

# Spark 4.2 runs an inner stream-stream join in update mode; an outer one only in append mode.
OUTER_JOIN_IN_UPDATE_MODE = (
    "LeftOuter join between two streaming DataFrames/Datasets is not supported in Update output mode, "
    "only in Append output mode;"
)


def running_total_after_join(join_type: str = "leftOuter") -> dict:
    """The latency example with a running aggregation (no window: update mode) after its stream-stream join."""
    manifest = copy.deepcopy(yaml.safe_load((EXAMPLES / "latency-correlation.yaml").read_text()))
    nodes = manifest["spec"]["pipeline"]["nodes"]
    assert [n["name"] for n in nodes] == ["requests", "responses", "latencies", "per-firm", "out"]
    nodes[2]["join"]["type"] = join_type
    del nodes[3]["aggregate"]["window"]
    return manifest


def test_outer_join_then_running_aggregation_is_refused_at_its_sink(spark_session) -> None:
    manifest = running_total_after_join()
    spec = validate(manifest["spec"]["pipeline"], "spec.pipeline")  # passes without Spark's analyser
    assert plan_problems(spark_session, spec, "spec.pipeline") == [
        Problem("spec.pipeline.nodes[4]", OUTER_JOIN_IN_UPDATE_MODE)
    ]


def test_inner_join_then_running_aggregation_passes(spark_session) -> None:
    spec = validate(running_total_after_join("inner")["spec"]["pipeline"], "spec.pipeline")
    assert plan_problems(spark_session, spec, "spec.pipeline") == []


def test_the_runner_refuses_it_the_same_way_before_starting_a_query(spark_session, tmp_path: Path) -> None:
    spec = validate(running_total_after_join()["spec"]["pipeline"], "pipeline")
    config = RunnerConfig(
        app="refused",
        revision="r1",
        kafkaBootstrap="127.0.0.1:9",  # never contacted: nothing starts
        pipeline=spec,
        checkpointRoot=str(tmp_path / "checkpoints"),
        controlPort=0,
    )
    active_before = len(spark_session.streams.active)
    run = PipelineRun(spark_session, config, pipeline_path="pipeline")
    with pytest.raises(PipelineInvalid) as refused:
        run.start()
    assert refused.value.problems == [Problem("pipeline.nodes[4]", OUTER_JOIN_IN_UPDATE_MODE)]
    assert run.queries == [] and len(spark_session.streams.active) == active_before
    assert not (tmp_path / "checkpoints").exists()


def chained(*downstream: dict, mode: str | None = None) -> dict:
    """Per-second maxima of a watermarked source, then `downstream` (the last one feeds the sink)."""
    sink: dict = {"table": "chained"} if mode is None else {"table": "chained", "outputMode": mode}
    return {
        "nodes": [
            {
                "name": "temps",
                "fromKafka": {
                    "topic": "temps",
                    "format": "json",
                    "schema": "sensor STRING, t INT, ts TIMESTAMP",
                    "eventTime": "ts",
                    "watermark": "1s",
                },
            },
            {
                "name": "per-second",
                "inputs": ["temps"],
                "aggregate": {"groupBy": ["sensor"], "window": {"tumbling": "1s"}, "aggregations": {"hi": "max(t)"}},
            },
            *downstream,
            {"name": "out", "inputs": [downstream[-1]["name"]], "toMemory": sink},
        ]
    }


PER_MINUTE = {
    "name": "per-minute",
    "inputs": ["per-second"],
    "aggregate": {"groupBy": ["sensor"], "window": {"tumbling": "1m"}, "aggregations": {"avg_hi": "avg(hi)"}},
}
PER_HOUR = {
    "name": "per-hour",
    "inputs": ["per-minute"],
    "aggregate": {"groupBy": ["sensor"], "window": {"tumbling": "1h"}, "aggregations": {"avg_hi": "max(avg_hi)"}},
}
BY_WINDOW_TIME = {
    "name": "per-instant",
    "inputs": ["per-second"],
    "aggregate": {"groupBy": ["window_time"], "aggregations": {"top": "max(hi)"}},
}
JOINED_BACK = {
    "name": "joined",
    "inputs": ["temps", "per-second"],
    "join": {"condition": "temps.sensor = `per-second`.sensor", "within": "1s", "type": "leftOuter"},
}


@pytest.mark.parametrize(
    "downstream",
    [
        [PER_MINUTE],
        [PER_MINUTE, PER_HOUR],
        [BY_WINDOW_TIME],
        [JOINED_BACK],
    ],
    ids=["window", "two windows", "group by window_time", "outer join"],
)
def test_what_follows_a_windowed_aggregation_over_its_window_time_passes(spark_session, downstream) -> None:
    spec = validate(chained(*downstream), "spec.pipeline")
    assert plan_problems(spark_session, spec, "spec.pipeline") == []


def test_chained_aggregations_in_update_mode_are_refused_at_the_sink(spark_session) -> None:
    spec = validate(chained(PER_MINUTE, mode="update"), "spec.pipeline")
    [problem] = plan_problems(spark_session, spec, "spec.pipeline")
    assert problem.path == "spec.pipeline.nodes[3]"
    assert problem.message.startswith(
        "Detected pattern of possible 'correctness' issue due to global watermark. The query contains stateful "
        "operation which can emit rows older than the current watermark"
    )


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_no_example_is_refused(name: str, spark_session, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO_ROOT)  # lookups read files relative to the repo root
    document = load_documents(EXAMPLES / f"{name}.yaml")[0]
    spec = validate(document.pipeline, document.prefix)
    compiled = compile_pipeline(  # compiles in full here (plan_problems would skip a plan it cannot build)
        spark_session,
        spec,
        kafka=None,
        prefix=document.prefix,
        source_frames=stand_in_frames(spark_session),
    )
    assert compiled.queries
    assert streaming_problems(spark_session, compiled, spec, document.prefix) == []


def _sluice(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_validate_cli_refuses_it_and_accepts_every_example(tmp_path: Path) -> None:
    """One `sluice validate` (one JVM): the refused app named at its sink node, the examples valid."""
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(running_total_after_join()))
    examples = [str(EXAMPLES / f"{name}.yaml") for name in EXAMPLE_NAMES]
    result = _sluice("validate", str(bad), *examples, cwd=tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"{bad}: spec.pipeline.nodes[4]: {OUTER_JOIN_IN_UPDATE_MODE}"
    assert [line.split(": ")[0] for line in lines[1:]] == examples
    assert all(line.endswith(": valid") for line in lines[1:]), lines
    assert _sluice("validate", "--no-spark", str(bad), cwd=tmp_path).returncode == 0  # only Spark can tell


def test_the_driver_refuses_it_at_start_as_the_operator_reports_it(tmp_path: Path) -> None:
    """The runner as the operator's driver runs it (a RunnerConfig): exit 2 before any query starts, the
    sink node's path and Spark's message, which the termination message (the app's status) carries."""
    spec = validate(running_total_after_join()["spec"]["pipeline"], "pipeline")
    config = RunnerConfig(
        app="refused",
        revision="r1",
        kafkaBootstrap="127.0.0.1:9",
        pipeline=spec,
        checkpointRoot=str(tmp_path / "checkpoints"),
        controlPort=0,
    )
    path = tmp_path / "runner.json"
    path.write_text(config.model_dump_json(by_alias=True, exclude_none=True))
    result = subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.runner", str(path), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 2, result.stderr[-3000:]
    problem = f"pipeline.nodes[4]: {OUTER_JOIN_IN_UPDATE_MODE}"
    assert f"error: invalid pipeline in {path}:\n{problem}\n" in result.stderr
    assert termination_message("failed at start", [problem]) == f"failed at start: spec.{problem}"
    assert not (tmp_path / "checkpoints").exists()
