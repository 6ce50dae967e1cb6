"""The validating admission webhook's decision (pure). Served by the real operator to the real
kube-apiserver, with the chart's configuration and certificate: e2e/tests/test_chart.py."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml

from sluice.operator import admission
from sluice.operator.desired import Invalid, admissible_spec
from sluice.operator.guard_rails import GuardRails
from sluice.operator.settings import ClaimDefaults, Settings

EXAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"


def wordcount() -> dict[str, Any]:
    return yaml.safe_load(EXAMPLE.read_text())


def with_unknown_input_and_duplicate_name(app: dict[str, Any]) -> dict[str, Any]:
    broken = copy.deepcopy(app)
    nodes = broken["spec"]["pipeline"]["nodes"]
    nodes[1]["inputs"] = ["lnes"]
    nodes[3]["name"] = nodes[2]["name"]
    return broken


def review(operation: str, new: dict[str, Any] | None, old: dict[str, Any] | None = None) -> None:
    body = new if new is not None else old
    admission.refuse_invalid_app(body=kopf.Body(body), old=kopf.Body(old) if old else None, operation=operation)


def test_an_invalid_app_is_refused_with_every_problem_and_its_path() -> None:
    with pytest.raises(kopf.AdmissionError) as refused:
        review("CREATE", with_unknown_input_and_duplicate_name(wordcount()))

    message = str(refused.value)
    assert refused.value.code == 422
    assert "spec.pipeline.nodes[1].inputs[0]: unknown node 'lnes'" in message
    assert "duplicate" in message and "spec.pipeline.nodes[3]" in message
    assert message.count("spec.") >= 2


def test_a_valid_app_is_admitted() -> None:
    review("CREATE", wordcount())
    review("UPDATE", wordcount(), wordcount())


def test_an_update_is_judged_by_its_spec_and_a_delete_not_at_all() -> None:
    valid, invalid = wordcount(), with_unknown_input_and_duplicate_name(wordcount())
    labelled = {**invalid, "metadata": {**invalid["metadata"], "finalizers": ["sluice.dev/finalizer"]}}

    review("UPDATE", labelled, invalid)  # metadata only: an app accepted before the webhook stays handled
    review("DELETE", None, invalid)
    with pytest.raises(kopf.AdmissionError):
        review("UPDATE", invalid, valid)


def test_sql_and_schema_syntax_errors_are_refused_without_a_jvm() -> None:
    app = wordcount()
    nodes = app["spec"]["pipeline"]["nodes"]
    nodes[0]["fromKafka"].update(format="json", schema="line STRING ts TIMESTAMP", eventTime="ts")
    nodes[2]["filter"] = "word != '' AND ("
    with pytest.raises(kopf.AdmissionError) as refused:
        review("CREATE", app)

    message = str(refused.value)
    assert "spec.pipeline.nodes[0].fromKafka.schema: bad schema: syntax error" in message
    assert "spec.pipeline.nodes[2].filter: bad SQL expression \"word != '' AND (\": syntax error" in message


def test_an_event_time_outside_the_schema_is_refused() -> None:
    app = wordcount()
    app["spec"]["pipeline"]["nodes"][0]["fromKafka"].update(
        format="json", schema="line STRING, `at` TIMESTAMP", eventTime="ts"
    )
    invalid = admissible_spec(app["spec"], Settings())
    assert isinstance(invalid, Invalid)
    assert invalid.message == (
        "spec.pipeline.nodes[0].fromKafka.eventTime: 'ts' is not a schema field (line, at) nor kafka_timestamp"
    )


def test_a_pod_local_checkpoint_is_refused_only_when_the_operator_makes_no_claims() -> None:
    spec = wordcount()["spec"]

    assert not isinstance(admissible_spec(spec, Settings()), Invalid)
    invalid = admissible_spec(spec, Settings(checkpoints=ClaimDefaults(create=False)))
    assert isinstance(invalid, Invalid) and invalid.message.startswith("spec.checkpoint: ")


RAILS = GuardRails(
    allowed_images=("registry.example/spark:", "sluice/"),
    allowed_service_accounts=("spark-jobs",),
    allowed_python_modules=("company.transforms",),
    forbidden_spark_conf=("spark.jars", "spark.driver.extraJavaOptions", "spark.kubernetes."),
)


def test_each_guard_rail_refuses_at_the_field_that_crosses_it() -> None:
    app = wordcount()
    spec = app["spec"]
    spec["spark"] = {
        "image": "evil.example/spark:1",
        "serviceAccount": "default",
        "sparkConf": {
            "spark.jars": "http://x/a.jar",
            "spark.kubernetes.driver.podTemplateFile": "/t",
            "spark.ui.port": "1",
        },
    }
    nodes = spec["pipeline"]["nodes"]
    nodes[1:1] = [
        {"name": "tidy", "inputs": [nodes[0]["name"]], "python": {"function": "os.path:join"}},
        {"name": "peek", "inputs": ["tidy"], "filter": "java_method /* hidden */ ('java.lang.System', 'exit', 1) > 0"},
    ]
    nodes[3]["inputs"] = ["peek"]

    invalid = admissible_spec(spec, Settings(guard_rails=RAILS))

    assert isinstance(invalid, Invalid)
    assert sorted(p.path for p in invalid.problems) == [
        "spec.pipeline.nodes[1].python.function",
        "spec.pipeline.nodes[2].filter",
        "spec.spark.image",
        "spec.spark.serviceAccount",
        "spec.spark.sparkConf.spark.jars",
        "spec.spark.sparkConf.spark.kubernetes.driver.podTemplateFile",
    ], invalid.message
    assert "calls java_method, refused on this cluster" in invalid.message
    assert not isinstance(admissible_spec(wordcount()["spec"], Settings(guard_rails=RAILS)), Invalid), (
        "within the rails"
    )


def test_reflection_in_sql_is_refused_by_default_and_python_steps_can_be_switched_off() -> None:
    spec = wordcount()["spec"]
    nodes = spec["pipeline"]["nodes"]
    nodes[1:1] = [
        {"name": "r", "inputs": [nodes[0]["name"]], "withColumns": {"x": "reflect('java.util.UUID', 'randomUUID')"}}
    ]
    nodes[2]["inputs"] = ["r"]

    invalid = admissible_spec(spec, Settings())
    assert isinstance(invalid, Invalid) and invalid.message.startswith(
        "spec.pipeline.nodes[1].withColumns.x: calls reflect"
    )
    off = GuardRails.from_env({"SLUICE_PYTHON_STEPS": "false", "SLUICE_REFUSED_SQL_FUNCTIONS": ""})
    assert not isinstance(admissible_spec(spec, Settings(guard_rails=off)), Invalid)
    spec = wordcount()["spec"]
    spec["pipeline"]["nodes"][1:1] = [
        {"name": "p", "inputs": ["lines"], "python": {"function": "company.transforms.x:f"}}
    ]
    spec["pipeline"]["nodes"][2]["inputs"] = ["p"]
    assert not isinstance(admissible_spec(spec, Settings(guard_rails=RAILS)), Invalid), "an allowed module"
    refused = admissible_spec(spec, Settings(guard_rails=off))
    assert isinstance(refused, Invalid) and "python steps are not allowed" in refused.message


def test_the_webhook_port_needs_a_certificate(capsys: pytest.CaptureFixture[str]) -> None:
    from sluice.operator.__main__ import main

    with pytest.raises(SystemExit) as exited:
        main(["--webhook-port", "9443"])

    assert exited.value.code == 2
    assert "--webhook-port needs --webhook-cert-dir" in capsys.readouterr().err
