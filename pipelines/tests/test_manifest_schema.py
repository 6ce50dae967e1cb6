"""`sluice schema`: the manifest's JSON Schema accepts every example and refuses what the model refuses, at the
same field (checked with a JSON Schema validator, as an editor would)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys

import jsonschema
import pytest
import yaml
from helpers import EXAMPLES

from sluice.api.schema import manifest_schema


def validator() -> jsonschema.protocols.Validator:
    schema = manifest_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def manifests() -> list[dict]:
    return [m for path in sorted(EXAMPLES.glob("*.yaml")) for m in yaml.safe_load_all(path.read_text()) if m]


@pytest.mark.parametrize("manifest", manifests(), ids=lambda m: m["metadata"]["name"])
def test_every_example_is_valid(manifest: dict) -> None:
    assert list(validator().iter_errors(manifest)) == []


@pytest.mark.parametrize(
    ("change", "path"),
    [
        (lambda m: m["spec"].pop("pipeline"), ["spec"]),
        (lambda m: m["spec"]["executors"].update(instances="three"), ["spec", "executors", "instances"]),
        (lambda m: m["spec"]["pipeline"]["nodes"][0].update(unknownKey=1), ["spec", "pipeline", "nodes", 0]),
        (lambda m: m.update(kind="SparkApplication"), ["kind"]),
        (
            lambda m: m["spec"]["checkpoint"].update(deletionPolicy="sometimes"),
            ["spec", "checkpoint", "deletionPolicy"],
        ),
    ],
)
def test_what_the_model_refuses_the_schema_refuses_at_the_field(change, path) -> None:
    manifest = copy.deepcopy(next(m for m in manifests() if m["metadata"]["name"] == "wordcount"))
    manifest["spec"].setdefault("executors", {"instances": 1})
    manifest["spec"].setdefault("checkpoint", {})
    change(manifest)
    errors = list(validator().iter_errors(manifest))
    assert errors, "refused"
    assert any(list(e.absolute_path)[: len(path)] == path for e in errors), [list(e.absolute_path) for e in errors]


def test_the_cli_prints_the_schema_and_its_version() -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", "schema"], capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(printed) == manifest_schema()
    shown = subprocess.run(
        [sys.executable, "-m", "sluice.pipelines.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    from importlib.metadata import version

    assert shown.strip() == f"sluice {version('sluice')}"
