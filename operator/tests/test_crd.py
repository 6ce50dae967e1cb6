"""The CRD is generated from the model and is a valid structural schema."""

from __future__ import annotations

import pytest
import yaml

from sluice.operator import crd


def _schemas(schema: dict, path: str = "$"):
    """Every schema node: the root, properties, items and additionalProperties, recursively."""
    yield path, schema
    for name, sub in schema.get("properties", {}).items():
        yield from _schemas(sub, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(schema.get(key), dict):
            yield from _schemas(schema[key], f"{path}.{key}")


def test_committed_crd_is_what_the_generator_produces():
    assert crd.CRD_FILE.read_text() == crd.render(), "run: python -m sluice.operator.crd --write"


def test_schema_is_structural():
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    nodes = list(_schemas(schema))
    assert len(nodes) > 100
    for path, node in nodes:
        assert not {"$ref", "anyOf", "allOf", "oneOf", "$defs"} & node.keys(), path
        assert node.get("type") in ("object", "array", "string", "integer", "number", "boolean") or node.get(
            "x-kubernetes-preserve-unknown-fields"
        ), path


def test_cross_field_rules_are_cel():
    text = crd.render()
    assert "self.min <= self.max" in text
    assert "exists_one(x, x)" in text
    assert "has(self.bootstrapServers) != has(self.strimziCluster)" in text


def test_yaml_11_booleans_are_quoted():
    # kubectl reads YAML 1.1, where a bare n, y, on or off is a boolean.
    text = yaml.dump({"n": "on", "y": ["off", "plain"]}, Dumper=crd._Yaml11SafeDumper)
    assert text == "'n': 'on'\n'y':\n- 'off'\n- plain\n"


def test_scale_subresource_and_printer_columns():
    version = crd.crd()["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.executors.instances"
    assert [c["name"] for c in version["additionalPrinterColumns"]] == [
        "Phase",
        "Revision",
        "Rollout",
        "Executors",
        "Desired",
        "Scaling",
        "Lag",
        "Rate",
        "Age",
    ]


def test_every_field_has_a_description():
    """What `kubectl explain` and editors show: every property of spec and status says what it is (the items of
    a list or map are described by their field)."""
    schema = crd.crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    fields = [
        (path, node)
        for path, node in _schemas(schema)
        if path.count(".") > 1 and not path.endswith((".items", ".additionalProperties"))
    ]
    undescribed = [path for path, node in fields if not node.get("description")]
    assert len(fields) > 200
    assert undescribed == []


def test_lists_keyed_by_name_are_list_maps_and_the_scale_names_its_pods():
    version = crd.crd()["spec"]["versions"][0]
    schema = version["schema"]["openAPIV3Schema"]["properties"]
    keyed = {
        "conditions": (schema["status"]["properties"]["conditions"], ["type"]),
        "nodes": (schema["spec"]["properties"]["pipeline"]["properties"]["nodes"], ["name"]),
        "topics": (schema["spec"]["properties"]["topics"], ["name"]),
    }
    for what, (node, keys) in keyed.items():
        assert (node["x-kubernetes-list-type"], node["x-kubernetes-list-map-keys"]) == ("map", keys), what
        assert set(keys) <= set(node["items"]["required"]), what
    assert version["subresources"]["scale"]["labelSelectorPath"] == ".status.selector"


def _annotated(release: str, schema: str) -> dict:
    return {"metadata": {"annotations": {crd.VERSION_ANNOTATION: release, crd.SCHEMA_ANNOTATION: schema}}}


@pytest.mark.parametrize(
    ("served", "upgraded"),
    [
        (None, False),  # the chart installs it
        (_annotated("0.1.0", "same"), False),
        (_annotated("0.1.0", "other"), True),  # a dev build of the release with another schema
        (_annotated("0.0.9", "same"), True),
        ({"metadata": {}}, True),  # a CRD from before the annotations
        (_annotated("0.2.0", "other"), False),  # a later release's: an old replica never takes it back
        (_annotated("0.1.0rc1", "other"), True),
        (_annotated("0.10.0", "other"), False),  # 0.10 is later than 0.1
    ],
)
def test_the_served_crd_is_upgraded_never_downgraded(served, upgraded):
    why = crd.crd_upgrade(served, _annotated("0.1.0", "same"))
    assert (why is not None) == upgraded, why
    if why:
        assert "0.1.0" in why and "schema same" in why


def test_the_crd_names_its_release_and_schema():
    ours = crd.crd(release="1.2.3")
    annotations = ours["metadata"]["annotations"]
    assert annotations[crd.VERSION_ANNOTATION] == "1.2.3"
    assert (
        annotations[crd.SCHEMA_ANNOTATION] == crd.crd(release="1.2.4")["metadata"]["annotations"][crd.SCHEMA_ANNOTATION]
    )
    assert crd.crd()["metadata"]["annotations"][crd.VERSION_ANNOTATION] == crd.operator_version()
