"""The runner as the driver runs it (a subprocess), and the `sluice` CLI."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml
from helpers import EXAMPLES, load_example, load_manifest
from kafka_output import read_committed
from test_control_api import call

from sluice.api.contract import RunnerConfig
from sluice.api.pipeline import PipelineSpec
from sluice.api.validation import PipelineInvalid
from sluice.pipelines import runner
from sluice.pipelines.local.kafka_io import produce
from sluice.pipelines.pipeline_run import PipelineRun
from sluice.pipelines.plancheck import error_summary
from sluice.pipelines.runner import TERMINATION_MESSAGE_LIMIT, termination_message
from sluice.testbed.common import free_port


def _wordcount_manifest(tmp_path: Path, new_topic) -> tuple[Path, dict[str, str]]:
    """The word count example on fresh topics, written to a file as the runner reads it."""
    app = load_example("wordcount", new_topic)
    path = tmp_path / "app.yaml"
    path.write_text(yaml.safe_dump(app.manifest))
    return path, {
        "lines": app.topics["wordcount-lines"],
        "counts": app.topics["wordcount-counts"],
        "dead": app.topics["wordcount-dead-letters"],
    }


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return 0, ""


def _wait_for(predicate, timeout: float, what: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"runner exited early with {proc.returncode}"
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.kafka
@pytest.mark.spark
def test_runner_serves_metrics_and_stops_cleanly_on_sigterm(kafka_bootstrap, new_topic, tmp_path):
    manifest, topics = _wordcount_manifest(tmp_path, new_topic)
    base = (int(time.time()) - 3600) * 1000  # recent: the broker's retention drops old timestamps
    produce(kafka_bootstrap, topics["lines"], [b"a b", b"b c", b"c"], timestamps_ms=[base, base + 100, base + 60_000])
    port = free_port()
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "sluice.pipelines.runner",
                str(manifest),
                "--bootstrap-servers",
                kafka_bootstrap,
                "--checkpoint-dir",
                str(tmp_path / "chk"),
                "--metrics-port",
                str(port),
                "--master",
                "local[2]",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    try:
        _wait_for(lambda: _get(f"http://127.0.0.1:{port}/healthz")[0] == 200, 180, "/healthz", proc)
        health = json.loads(_get(f"http://127.0.0.1:{port}/healthz")[1])
        assert {q["name"] for q in health["queries"]} == {"out", "lines-dead-letters"}

        _wait_for(lambda: len(read_committed(kafka_bootstrap, topics["counts"])) >= 3, 180, "window counts", proc)
        counts = {
            (r["word"], r["count"])
            for r in map(json.loads, (m.value for m in read_committed(kafka_bootstrap, topics["counts"])))
        }
        assert counts == {("a", 1), ("b", 2), ("c", 1)}

        _, metrics = _get(f"http://127.0.0.1:{port}/metrics")
        assert 'sluice_input_rows_total{app="wordcount",query="out"} 3.0' in metrics
        assert "sluice_kafka_records_behind_latest" in metrics
        assert 'sluice_executors{app="wordcount"}' in metrics
        assert _get(f"http://127.0.0.1:{port}/nope")[0] == 404

        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _sluice(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`sluice` in a terminal 200 columns wide (rich reads COLUMNS)."""
    return subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, "COLUMNS": "200"},
    )


# A log4j line ("26/11/23 00:44:36 INFO SparkContext: ..."), the JVM's start-up note, a console progress bar,
# a librdkafka log line ("%3|1795394669.768|FAIL|rdkafka#producer-4| ...").
SPARK_NOISE = re.compile(
    r"\d\d/\d\d/\d\d \d\d:\d\d:\d\d (INFO|WARN|ERROR)|WARNING: Using incubator|\[Stage \d|"
    r"Setting default log level|rdkafka#|QueryContextLogger"
)


def assert_quiet_with_spark_log(result: subprocess.CompletedProcess[str], cwd: Path, app: str) -> Path:
    """The terminal shows no Spark output; the log file it names (once) has Spark's lines."""
    terminal = result.stdout + result.stderr
    assert not SPARK_NOISE.search(terminal), terminal[-3000:]
    named = re.findall(r"Spark's log: (\S+)", terminal)
    assert len(named) == 1, terminal[-3000:]
    log_file = cwd / named[0]
    assert re.fullmatch(rf"\.sluice/logs/{app}-\d{{8}}-\d{{6}}\.log", named[0]) and log_file.is_file()
    assert "INFO SparkContext: Running Spark version" in log_file.read_text()
    return log_file


@pytest.mark.kafka
def test_the_demos_kafka_clients_print_nothing(kafka_bootstrap):
    """The local helpers the demo uses (topics made and deleted, records produced and read) leave librdkafka's
    log lines out of the terminal."""
    script = (
        f"from sluice.pipelines.local.kafka_io import *\n"
        f"b, t = {kafka_bootstrap!r}, 'quiet-{time.time_ns()}'\n"
        "create_topic(b, t); produce(b, t, [b'x']); consume_all(b, t); end_offsets(b, t); delete_topics(b, [t])"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert not SPARK_NOISE.search(result.stdout + result.stderr), result.stderr


def test_validate_cli_accepts_every_example():
    result = _sluice("validate", "--no-spark", *map(str, sorted(EXAMPLES.glob("*.yaml"))))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": valid") == len(list(EXAMPLES.glob("*.yaml")))


def test_validate_cli_prints_every_error_with_its_path(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "sluice.dev/v1alpha1",
                "kind": "StreamingApp",
                "metadata": {"name": "bad"},
                "spec": {
                    "pipeline": {
                        "nodes": [
                            {"name": "src", "fromKafka": {"topic": "t", "watermark": "soon"}},
                            {"name": "out", "inputs": ["srcc"], "toConsole": {}},
                        ]
                    }
                },
            }
        )
    )
    result = _sluice("validate", "--no-spark", str(bad))
    assert result.returncode == 1
    assert f"{bad}: spec.pipeline.nodes[0].fromKafka.watermark: invalid duration 'soon'" in result.stdout
    assert f"{bad}: spec.pipeline.nodes[1].inputs[0]: unknown node 'srcc'" in result.stdout
    assert f"{bad}: spec.pipeline.nodes[0]: the output of 'src' is not used by any node" in result.stdout


WHOLE_APP_PROBLEMS = """\
apiVersion: sluice.dev/v1alpha1
kind: StreamingApp
metadata: {name: bad}
spec:
  kafka: {bootstrapServers: "kafka:9092", strimziCluster: {name: my-cluster}}
  topics: [{name: lines, partitions: 0}, {name: counts}, {name: counts}]
  executors: {min: 5, max: 2}
  pipeline:
    nodes:
      - {name: src, fromKafka: {topic: lines, format: json, schema: "id STRING, ts", eventTime: ts}}
      - {name: keep, inputs: [src], filter: "id != '' AND ("}
      - {name: out, inputs: [keep], toConsole: {}}
"""


def test_validate_cli_checks_the_whole_app_as_the_operator_does(tmp_path):
    path = tmp_path / "app.yaml"
    path.write_text(WHOLE_APP_PROBLEMS)
    result = _sluice("validate", "--no-spark", str(path))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{path}: {line}"
        for line in (
            "spec.executors: min (5) must not exceed max (2)",
            "spec.kafka: set exactly one of 'bootstrapServers' or 'strimziCluster'",
            "spec.pipeline.nodes[0].fromKafka.schema: bad schema: field 'ts' has no type",
            "spec.pipeline.nodes[1].filter: bad SQL expression \"id != '' AND (\": syntax error at line 1, column 14 "
            "near '('",
            "spec.topics: duplicate topic name 'counts' (topics[1] and topics[2])",
            "spec.topics[0].partitions: Input should be greater than or equal to 1 (got 0)",
        )
    ]


def test_validate_cli_wants_one_kafka_of_the_two(tmp_path):
    manifest = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())
    manifest["spec"]["kafka"] = {}
    path = tmp_path / "no-kafka.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = _sluice("validate", "--no-spark", str(path))
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        f"{path}: spec.kafka: set exactly one of 'bootstrapServers' or 'strimziCluster'"
    ]


def test_validate_cli_still_takes_a_bare_pipeline(tmp_path):
    pipeline = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())["spec"]["pipeline"]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    assert _sluice("validate", "--no-spark", str(path)).stdout == f"{path}: pipeline: valid\n"
    pipeline["nodes"][2]["filter"] = "word !="
    path.write_text(yaml.safe_dump(pipeline))
    result = _sluice("validate", "--no-spark", str(path))
    assert result.returncode == 1
    assert result.stdout.startswith(f"{path}: nodes[2].filter: bad SQL expression 'word !=': syntax error")


@pytest.mark.spark
def test_validate_cli_parses_sql_with_spark(tmp_path):
    manifest = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())
    manifest["spec"]["pipeline"]["nodes"][2]["filter"] = "word != '' AND ("
    path = tmp_path / "sql.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = _sluice("validate", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert "spec.pipeline.nodes[2].filter: bad SQL expression" in result.stdout
    assert_quiet_with_spark_log(result, tmp_path, "sluice-validate")


def test_validate_cli_reports_what_spark_refuses_without_spark_s_log_lines(tmp_path):
    manifest = yaml.safe_load((EXAMPLES / "wordcount.yaml").read_text())
    nodes = manifest["spec"]["pipeline"]["nodes"]
    nodes.insert(4, {"name": "rows", "inputs": ["counts"], "select": ["window.start AS start", "word"]})
    nodes[5]["inputs"] = ["rows"]
    path = tmp_path / "refused.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = _sluice("validate", str(path), cwd=tmp_path)
    assert result.returncode == 1
    assert "spec.pipeline.nodes[4].select: [UNRESOLVED_COLUMN" in result.stdout, result.stdout + result.stderr
    log_file = assert_quiet_with_spark_log(result, tmp_path, "sluice-validate")
    assert '"logger": "SQLQueryContextLogger"' in log_file.read_text()


def test_validate_cli_reports_unreadable_yaml(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("nodes: [\n")
    result = _sluice("validate", "--no-spark", str(path))
    assert result.returncode == 1
    assert "not valid YAML" in result.stdout


@pytest.mark.kafka
@pytest.mark.spark
def test_sluice_run_until_caught_up(kafka_bootstrap, new_topic, tmp_path):
    manifest, topics = _wordcount_manifest(tmp_path, new_topic)
    base = (int(time.time()) - 3600) * 1000
    produce(kafka_bootstrap, topics["lines"], [b"x y", b"y", b"z"], timestamps_ms=[base, base + 10, base + 60_000])
    result = _sluice(
        "run",
        str(manifest),
        "--bootstrap-servers",
        kafka_bootstrap,
        "--checkpoint-dir",
        str(tmp_path / "chk"),
        "--cores",
        "2",
        "--until-caught-up",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "sluice run: wordcount" in result.stderr  # the live view
    assert_quiet_with_spark_log(result, tmp_path, "sluice-wordcount")
    header = next(line for line in result.stderr.splitlines() if "backlog" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == [
        "query",
        "status",
        "in rows/s",
        "processed/s",
        "backlog",
        "batch ms",
        "watermark (UTC)",
        "state rows",
        "dead letters",
    ]
    assert result.stderr.splitlines()[-3:] == [
        f"read: {topics['lines']}: 3 records",
        "wrote: out (spec.pipeline.nodes[4]): records not counted by the sink",
        "wrote: lines-dead-letters (spec.pipeline.deadLetter): 0 records",
    ]
    counts = {
        (r["word"], r["count"])
        for r in (json.loads(m.value) for m in read_committed(kafka_bootstrap, topics["counts"]))
    }
    assert counts == {("x", 1), ("y", 2)}


@pytest.mark.kafka
@pytest.mark.spark
def test_sluice_run_names_the_node_of_a_failing_query(kafka_bootstrap, new_topic, tmp_path):
    manifest, topics = _wordcount_manifest(tmp_path, new_topic)
    app = yaml.safe_load(manifest.read_text())
    app["spec"]["pipeline"]["nodes"][2]["filter"] = "word != '' AND raise_error(concat('bad word ', word)) IS NULL"
    manifest.write_text(yaml.safe_dump(app))
    produce(kafka_bootstrap, topics["lines"], [b"x"], timestamps_ms=[(int(time.time()) - 3600) * 1000])
    result = _sluice(
        "run",
        str(manifest),
        "--bootstrap-servers",
        kafka_bootstrap,
        "--checkpoint-dir",
        str(tmp_path / "chk"),
        "--cores",
        "2",
        "--until-caught-up",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(r"query failed: spec\.pipeline\.nodes\[4\] \(out\): .*bad word x", result.stderr), result.stderr[
        -3000:
    ]


@pytest.mark.kafka
@pytest.mark.spark
def test_a_failed_run_tells_its_error_on_the_control_api_before_the_driver_exits(kafka_bootstrap, new_topic, tmp_path):
    """The operator reads why a driver failed from /v1/status (spark-operator deletes a failed driver's pod,
    and its termination message, within seconds): the runner answers a while after the failure, then exits.
    Its queries stopped, it says it is drained (a rollback resumes the driver it replaced at once): asked to
    drain, it answers so; asked to run, it refuses."""
    lines, counts, dead_letters = new_topic(1), new_topic(1), new_topic(1)
    token = tmp_path / "token"
    token.write_text("s3cret")
    config = _runner_config(
        kafkaBootstrap=kafka_bootstrap,
        checkpointRoot=str(tmp_path / "chk"),
        controlPort=free_port(),
        controlTokenFile=str(token),
    )
    nodes = config["pipeline"]["nodes"]
    nodes[0]["fromKafka"]["topic"], nodes[-1]["toKafka"]["topic"] = lines, counts
    config["pipeline"]["deadLetter"]["toKafka"]["topic"] = dead_letters
    nodes[2]["filter"] = "word != '' AND raise_error(concat('bad word ', word)) IS NULL"
    path, message = tmp_path / "runner.json", tmp_path / "termination-log"
    path.write_text(json.dumps(config))
    message.touch()
    produce(kafka_bootstrap, lines, [b"x"], timestamps_ms=[(int(time.time()) - 3600) * 1000])
    script = _runner_script(message)
    log = tmp_path / "runner.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", script, str(path), "--master", "local[2]"], stdout=out, stderr=subprocess.STDOUT
        )
    try:
        base = f"http://127.0.0.1:{config['controlPort']}"

        def failed_query() -> dict | None:
            """The failed query once the run stopped its queries (drained)."""
            code, body = _get(f"{base}/v1/status")
            if code != 200 or json.loads(body)["state"] != "drained":
                return None
            failed = [q for q in json.loads(body)["queries"] if q["error"]]
            return failed[0] if failed else None

        deadline, failed = time.monotonic() + 240, None
        while failed is None and proc.poll() is None and time.monotonic() < deadline:
            failed = failed_query()
            time.sleep(0.5)
        assert failed is not None, (
            f"no failed query in /v1/status of a drained run (runner exit {proc.poll()}): {log.read_text()[-2000:]}"
        )
        assert failed["name"] == "out" and re.fullmatch(
            r"spec\.pipeline\.nodes\[4\]: .*bad word x.*", failed["error"]
        ), failed
        drained = call("PUT", f"{base}/v1/state", b'{"state": "drained"}', token="s3cret")
        assert drained[0] == 200 and drained[1]["state"] == drained[1]["previous"] == "drained", drained
        resumed = call("PUT", f"{base}/v1/state", b'{"state": "running"}', token="s3cret")
        assert resumed == (409, {"error": "the driver is stopping", "field": "state"}), resumed
        assert proc.wait(timeout=120) == 1, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert re.fullmatch(r"failed: spec\.pipeline\.nodes\[\d\] \(out\): .*bad word x.*", message.read_text()), (
        message.read_text()
    )


# ------------------------------------------------------------------------------ RunnerConfig


def _runner_config(**changes) -> dict:
    """The word count example as the RunnerConfig document the operator writes (JSON)."""
    config = RunnerConfig(
        app="wordcount",
        revision="rev-1",
        kafkaBootstrap="127.0.0.1:9",
        checkpointRoot="/tmp/chk",
        pipeline=PipelineSpec.model_validate(load_manifest("wordcount")["spec"]["pipeline"]),
        controlPort=0,
    )
    return {**json.loads(config.model_dump_json(by_alias=True, exclude_none=True)), **changes}


def test_a_query_is_named_by_the_path_of_its_sink():
    run = PipelineRun(None, RunnerConfig.model_validate(_runner_config()))  # type: ignore[arg-type]
    assert run.query_path("out") == "pipeline.nodes[4]"
    assert run.query_path("lines-dead-letters") == "pipeline.deadLetter"


def test_an_error_raised_in_a_python_sink_is_told_by_its_exception():
    wrapped = (
        "An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):\n"
        '  File "sink.py", line 3, in write\n'
        "pyspark.errors.exceptions.captured.SparkRuntimeException: [USER_RAISED_EXCEPTION] bad SQLSTATE: P0001"
    )
    assert error_summary(wrapped) == "SparkRuntimeException: [USER_RAISED_EXCEPTION] bad SQLSTATE: P0001"
    assert error_summary("[UNRESOLVED_COLUMN] wrd\nmore") == "[UNRESOLVED_COLUMN] wrd"


def _runner(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.runner", *args], capture_output=True, text=True, timeout=120
    )


def test_runner_refuses_a_bad_runner_config_naming_each_field(tmp_path):
    config = _runner_config(controlPort=70000, surprise=True)
    del config["kafkaBootstrap"]
    config["pipeline"]["nodes"][0]["fromKafka"]["watermark"] = "soon"
    config["pipeline"]["nodes"][1]["inputs"] = ["linez"]
    path = tmp_path / "runner.json"
    path.write_text(json.dumps(config))
    result = _runner(str(path))
    assert result.returncode == 2, result.stderr
    problems = result.stderr.splitlines()
    assert problems[0] == f"error: invalid {path}:"
    assert "controlPort: Input should be less than or equal to 65535 (got 70000)" in problems
    assert "kafkaBootstrap: required" in problems
    assert "surprise: unknown key 'surprise'" in problems
    assert any(p.startswith("pipeline.nodes[0].fromKafka.watermark: invalid duration 'soon'") for p in problems)
    assert "pipeline.nodes[1].inputs[0]: unknown node 'linez'" in problems
    assert "Spark" not in result.stderr  # refused before Spark started


def test_a_runner_config_is_the_only_input(tmp_path):
    path = tmp_path / "runner.yaml"
    path.write_text(yaml.safe_dump(_runner_config()))
    result = _runner(str(path), "--bootstrap-servers", "elsewhere:9092", "--control-port", "9999")
    assert result.returncode == 2
    assert "--bootstrap-servers: not allowed with a RunnerConfig (it carries this setting)" in result.stderr
    assert "--control-port: not allowed with a RunnerConfig (it carries this setting)" in result.stderr


@pytest.mark.spark
def test_runner_config_sql_is_parsed_by_spark_with_its_path(spark_session):
    config = RunnerConfig.model_validate(_runner_config())
    config.pipeline.nodes[2].filter = "word != '' AND ("
    with pytest.raises(PipelineInvalid) as info:
        PipelineRun(spark_session, config).start()
    assert [p.path for p in info.value.problems] == ["pipeline.nodes[2].filter"]
    assert info.value.problems[0].message.startswith("bad SQL expression")


# ------------------------------------------------------------------------------ termination message


def test_the_termination_message_is_one_paragraph_of_app_paths_within_what_kubernetes_keeps():
    message = termination_message(
        "failed at start",
        ["pipeline.nodes[2].filter: [UNRESOLVED_COLUMN] wrd\n  at Spark", "controlPort: bad", "spec.pipeline: x"],
    )
    assert message == (
        "failed at start: spec.pipeline.nodes[2].filter: [UNRESOLVED_COLUMN] wrd; controlPort: bad; spec.pipeline: x"
    )
    long = termination_message("failed", ["pipeline.deadLetter (lines-dead-letters): " + "é" * 5000])
    assert len(long.encode()) <= TERMINATION_MESSAGE_LIMIT
    assert long.startswith("failed: spec.pipeline.deadLetter (lines-dead-letters): é") and long.endswith("…")


def test_no_termination_message_where_kubernetes_made_no_file(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "TERMINATION_MESSAGE_PATH", str(tmp_path / "termination-log"))
    runner.write_termination_message("failed at start: x")
    assert not (tmp_path / "termination-log").exists()  # a local run: nothing written
    (tmp_path / "termination-log").touch()  # as the kubelet does before the container starts
    runner.write_termination_message("failed at start: x")
    assert (tmp_path / "termination-log").read_text() == "failed at start: x"


def _runner_script(termination_message: Path) -> str:
    """`python -c` source running the runner as the driver does, its termination message file where given."""
    return (
        "import sys; from sluice.pipelines import runner; "
        f"runner.TERMINATION_MESSAGE_PATH = {str(termination_message)!r}; sys.exit(runner.main(sys.argv[1:]))"
    )


def _runner_leaving_a_termination_message(tmp_path: Path, config: dict) -> tuple[subprocess.CompletedProcess, str]:
    """The runner as the driver runs it, with the termination message file where the kubelet would make it."""
    path, message = tmp_path / "runner.json", tmp_path / "termination-log"
    path.write_text(json.dumps(config))
    message.touch()
    script = _runner_script(message)
    result = subprocess.run(
        [sys.executable, "-c", script, str(path), "--master", "local[1]"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    return result, message.read_text()


def test_a_bad_runner_config_leaves_its_problems_as_the_termination_message(tmp_path):
    config = _runner_config()
    config["pipeline"]["nodes"][1]["inputs"] = ["linez"]
    result, message = _runner_leaving_a_termination_message(tmp_path, config)
    assert result.returncode == 2, result.stderr[-3000:]
    assert message == (
        "failed at start: spec.pipeline.nodes[0]: the output of 'lines' is not used by any node (connect it to a "
        "sink); spec.pipeline.nodes[1].inputs[0]: unknown node 'linez'"
    )


@pytest.mark.spark
def test_a_start_up_failure_leaves_the_node_path_as_the_termination_message(tmp_path):
    config = _runner_config(checkpointRoot=str(tmp_path / "chk"))
    config["pipeline"]["nodes"][2]["filter"] = "wrd != ''"  # parses; Spark's analyzer knows no column wrd
    result, message = _runner_leaving_a_termination_message(tmp_path, config)
    assert result.returncode == 2, result.stderr[-3000:]
    assert re.fullmatch(r"failed at start: spec\.pipeline\.nodes\[2\]\.filter: .*UNRESOLVED_COLUMN.*wrd.*", message), (
        message
    )
    assert "\n" not in message


@pytest.mark.kafka
@pytest.mark.spark
def test_make_demo_prints_only_its_own_output(tmp_path):
    """`make demo` end to end (its own broker when none runs): its windows and summary, Spark's log named once
    and kept out of the terminal, and no librdkafka line after its broker stops."""
    result = subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.demo", "3000"],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=tmp_path,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert "every on-time word counted once; every late line dead-lettered" in result.stdout
    assert "summary" in result.stdout and "lines in (on time)" in result.stdout
    assert_quiet_with_spark_log(result, tmp_path, "sluice-demo")


@pytest.mark.spark
def test_validate_cli_serves_every_file_from_one_jvm(tmp_path):
    paths = sorted(EXAMPLES.glob("*.yaml"))[:2]
    result = _sluice("validate", *map(str, paths), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count(": valid") == 2
    assert_quiet_with_spark_log(result, tmp_path, "sluice-validate")  # one log named: one Spark session
