"""The `sluice` command's manners, in subprocesses as a user runs it: exit codes, `-o json|yaml`, files as
arguments or with `-f`, stdin, directories, multi-document files holding other kinds."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

WORDCOUNT = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"
CONFIG_MAP = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "settings"}, "data": {"a": "b"}}


def sluice(*args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", *args],
        capture_output=True,
        text=True,
        input=stdin,
        env=env,
        timeout=120,
    )


@pytest.fixture
def app() -> dict[str, Any]:
    return yaml.safe_load(WORDCOUNT.read_text())


def write(path: Path, *documents: dict[str, Any]) -> str:
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def with_filter(app: dict[str, Any], filter_: str = "length(word) > 1") -> dict[str, Any]:
    changed = copy.deepcopy(app)
    changed["spec"]["pipeline"]["nodes"][2]["filter"] = filter_
    return changed


def test_plan_of_an_unchanged_app_exits_0(app, tmp_path) -> None:
    old = write(tmp_path / "old.yaml", app)
    result = sluice("plan", old, "--from", old)
    assert result.returncode == 0, result.stderr
    assert "no rollout" in result.stdout


def test_plan_of_a_filter_change_is_a_hot_swap_of_its_query_and_exits_1(app, tmp_path) -> None:
    old, new = write(tmp_path / "old.yaml", app), write(tmp_path / "new.yaml", with_filter(app))
    result = sluice("plan", new, "--from", old)
    assert result.returncode == 1, result.stderr
    assert "strategy: hotSwap (picked by auto)" in result.stdout
    assert "spec.pipeline.nodes[2].filter" in result.stdout
    (plan,) = json.loads(sluice("plan", new, "--from", old, "-o", "json").stdout)
    assert (plan["app"], plan["strategy"], plan["changes"]) == ("wordcount", "hotSwap", True)
    assert {q["name"]: q["action"] for q in plan["queries"]} == {"lines-dead-letters": "keep", "out": "restart"}
    assert [o["strategy"] for o in plan["options"] if o["safe"]] == [
        "hotSwap",
        "fencedHandover",
        "checkpointMigration",
        "restart",
    ]
    assert yaml.safe_load(sluice("plan", new, "--from", old, "-o", "yaml").stdout) == [plan]


def test_plan_says_why_a_stated_strategy_is_refused(app, tmp_path) -> None:
    changed = copy.deepcopy(app)
    changed["spec"]["pipeline"]["nodes"][3]["aggregate"]["window"]["tumbling"] = "10s"
    changed["spec"]["updateStrategy"] = {"type": "hotSwap"}
    old, new = write(tmp_path / "old.yaml", app), write(tmp_path / "new.yaml", changed)
    result = sluice("plan", new, "--from", old, "-o", "json")
    assert result.returncode == 1, result.stderr
    (plan,) = json.loads(result.stdout)
    assert plan["strategy"] is None and plan["auto"] == "checkpointMigration"
    assert "spec.pipeline.nodes[3].aggregate.window" in plan["refusal"]


def test_plan_reads_stdin_and_skips_other_kinds_by_name(app, tmp_path) -> None:
    old = write(tmp_path / "old.yaml", app)
    stdin = yaml.safe_dump_all([CONFIG_MAP, with_filter(app)])
    result = sluice("plan", "-", "--from", old, stdin=stdin)
    assert result.returncode == 1, result.stderr
    assert "ConfigMap/settings: skipped (not a StreamingApp)" in result.stderr
    assert "strategy: hotSwap" in result.stdout


def test_plan_of_an_invalid_app_names_the_field_and_exits_2(app, tmp_path) -> None:
    old = write(tmp_path / "old.yaml", app)
    broken = copy.deepcopy(app)
    broken["spec"]["pipeline"]["nodes"][2]["inputs"] = ["nowhere"]
    result = sluice("plan", write(tmp_path / "new.yaml", broken), "--from", old)
    assert result.returncode == 2
    assert "spec.pipeline.nodes[2].inputs[0]" in result.stderr


def test_plan_against_the_cluster_without_kubectl_says_what_to_do(app, tmp_path) -> None:
    new = write(tmp_path / "new.yaml", app)
    result = sluice("plan", new, env={**os.environ, "PATH": str(tmp_path)})
    assert result.returncode == 2
    assert "kubectl is not on PATH" in result.stderr and "--from" in result.stderr


def test_validate_takes_a_directory_and_stdin_and_skips_other_kinds(app, tmp_path) -> None:
    folder = tmp_path / "manifests"
    folder.mkdir()
    write(folder / "a.yaml", CONFIG_MAP, app)
    write(folder / "b.yml", with_filter(app))
    (folder / "notes.txt").write_text("not a manifest")
    result = sluice("validate", "--no-spark", str(folder))
    assert result.returncode == 0, result.stdout
    assert result.stdout.splitlines() == [
        f"{folder / 'a.yaml'}: ConfigMap/settings: skipped (not a StreamingApp)",
        f"{folder / 'a.yaml'}: wordcount: valid",
        f"{folder / 'b.yml'}: wordcount: valid",
    ]
    broken = copy.deepcopy(app)
    broken["spec"]["pipeline"]["nodes"][2]["inputs"] = ["nowhere"]
    result = sluice("validate", "--no-spark", "-", stdin=yaml.safe_dump(broken))
    assert result.returncode == 1
    assert "spec.pipeline.nodes[2].inputs[0]" in result.stdout


def test_other_kinds_are_skipped_but_a_runner_config_is_the_runners_to_read() -> None:
    from sluice.api.validation import document_from

    assert document_from(CONFIG_MAP, "f.yaml").other_kind == "ConfigMap/settings"
    runner = {"apiVersion": "sluice.dev/v1alpha1", "kind": "RunnerConfig", "app": "a"}
    document = document_from(runner, "runner.json")
    assert document.other_kind is None and document.pipeline == runner, "the driver reads its config whole"


def test_a_mistyped_kind_of_sluices_group_is_an_error_not_a_skip(app, tmp_path) -> None:
    app["kind"] = "StreamingApps"
    result = sluice("validate", "--no-spark", write(tmp_path / "app.yaml", app))
    assert result.returncode == 1 and "kind: must be StreamingApp (got 'StreamingApps')" in result.stdout


def test_plan_of_a_runtime_only_change_is_a_resubmission_not_a_rollout(app, tmp_path) -> None:
    changed = copy.deepcopy(app)
    changed["spec"].setdefault("spark", {})["sparkConf"] = {"spark.sql.shuffle.partitions": "7"}
    old, new = write(tmp_path / "old.yaml", app), write(tmp_path / "new.yaml", changed)
    result = sluice("plan", new, "--from", old, "-o", "json")
    assert result.returncode == 1, result.stderr
    (plan,) = json.loads(result.stdout)
    assert (plan["strategy"], plan["resubmit"], plan["rollout"]) == (None, True, False)
    assert plan["runtime"] and plan["runtime"][0].startswith("spec.spark.sparkConf")


def test_validate_answers_in_json_and_yaml_per_document(app, tmp_path) -> None:
    broken = copy.deepcopy(app)
    broken["spec"]["pipeline"]["nodes"][2]["inputs"] = ["nowhere"]
    path = write(tmp_path / "apps.yaml", CONFIG_MAP, app, broken)
    result = sluice("validate", "--no-spark", path, "-o", "json")
    assert result.returncode == 1, result.stderr
    skipped, valid, invalid = json.loads(result.stdout)
    assert skipped == {"file": path, "skipped": "ConfigMap/settings"}
    assert valid == {"file": path, "app": "wordcount", "valid": True, "problems": []}
    assert invalid["valid"] is False and invalid["app"] == "wordcount"
    assert "spec.pipeline.nodes[2].inputs[0]" in [p["path"] for p in invalid["problems"]], invalid
    as_yaml = sluice("validate", "--no-spark", path, "-o", "yaml")
    assert as_yaml.returncode == 1 and yaml.safe_load(as_yaml.stdout) == [skipped, valid, invalid]


def test_files_are_given_as_arguments_or_with_f_as_to_kubectl(app, tmp_path) -> None:
    first, second = write(tmp_path / "a.yaml", app), write(tmp_path / "b.yaml", with_filter(app))
    result = sluice("validate", "--no-spark", "-f", first, "--filename", second)
    assert result.returncode == 0 and result.stdout.splitlines() == [
        f"{first}: wordcount: valid",
        f"{second}: wordcount: valid",
    ]
    plan = sluice("plan", "-f", second, "--from", first, "-o", "json")
    assert plan.returncode == 1 and json.loads(plan.stdout)[0]["app"] == "wordcount"


@pytest.mark.parametrize("command", ["validate", "plan", "graph", "run"])
def test_no_input_is_a_usage_error(command) -> None:
    result = sluice(command)
    assert result.returncode == 2 and "no input: give a file, a directory or -" in result.stderr, result.stderr


@pytest.mark.parametrize("command", ["validate", "plan", "graph"])
def test_a_directory_without_manifests_is_a_usage_error(command, tmp_path) -> None:
    (tmp_path / "notes.txt").write_text("not a manifest")
    result = sluice(command, str(tmp_path))
    assert result.returncode == 2 and f"no manifest (*.yaml, *.yml, *.json) in {tmp_path}" in result.stderr


def test_a_reader_that_goes_away_ends_the_output_without_a_traceback() -> None:
    """`sluice schema | head -1`: the schema is longer than the pipe takes once its reader has closed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sluice.pipelines.cli", "schema"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    assert process.stdout.read(10)  # the head of it, then the reader goes away
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=60) == 141 and stderr == "", stderr


def test_graph_and_run_take_one_app_and_name_what_they_skip(app, tmp_path) -> None:
    one = write(tmp_path / "one.yaml", CONFIG_MAP, app)
    drawn = sluice("graph", "-f", one)
    assert drawn.returncode == 0 and drawn.stdout.startswith('digraph "wordcount"')
    assert f"{one}: ConfigMap/settings: skipped (not a StreamingApp)" in drawn.stderr
    two = write(tmp_path / "two.yaml", app, with_filter(app))
    for command in ("graph", "run"):
        result = sluice(command, two)
        assert result.returncode == 2 and "holds 2 apps" in result.stderr and "this command takes one" in result.stderr


def test_schema_prints_json_or_yaml() -> None:
    as_json, as_yaml = sluice("schema"), sluice("schema", "-o", "yaml")
    assert as_json.returncode == as_yaml.returncode == 0
    assert json.loads(as_json.stdout) == yaml.safe_load(as_yaml.stdout)
    assert json.loads(as_json.stdout)["title"] == "StreamingApp"


@pytest.mark.kube  # kubectl, of the pinned version the test bed builds
def test_kubectl_runs_sluice_as_its_plugin(app, tmp_path) -> None:
    from sluice.testbed.kube import kubernetes_binaries

    kubectl = kubernetes_binaries("kubectl")["kubectl"]
    plugin = Path(sys.executable).parent / "kubectl-sluice"
    assert plugin.exists(), "the package installs kubectl-sluice beside sluice"
    old, new = write(tmp_path / "old.yaml", app), write(tmp_path / "new.yaml", with_filter(app))
    env = {**os.environ, "PATH": os.pathsep.join([str(plugin.parent), str(kubectl.parent), os.environ["PATH"]])}
    result = subprocess.run(
        [str(kubectl), "sluice", "plan", new, "--from", old, "-o", "json"], capture_output=True, text=True, env=env
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)[0]["strategy"] == "hotSwap"
