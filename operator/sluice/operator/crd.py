"""Generate the StreamingApp CRD from the pydantic models (the single source of truth).

`python -m sluice.operator.crd` prints it; `make crds` writes crds/ and copies them into the chart; a
test fails when the committed files differ from what this produces. The operator brings the served CRD up to
its own at start (`crd_upgrade`): Helm installs a chart's CRDs once and never upgrades them.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from collections.abc import Mapping
from importlib.metadata import version as installed_version
from pathlib import Path
from typing import Any

import yaml

from .model import GROUP, KIND, PLURAL, SHORT_NAMES, SINGULAR, VERSION, StreamingAppSpec, StreamingAppStatus

REPO_ROOT = Path(__file__).resolve().parents[3]
CRD_FILE = REPO_ROOT / "crds" / "sluice.dev_streamingapps.yaml"

# JSON-schema keywords that carry over to a Kubernetes structural schema as they are.
_COPIED = (
    "description",
    "pattern",
    "minLength",
    "maxLength",
    "minimum",
    "maximum",
    "minItems",
    "maxItems",
    "enum",
    "format",
    "x-kubernetes-validations",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
)


class UnsupportedSchema(ValueError):
    pass


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Pydantic's JSON schema -> an OpenAPI v3 structural schema (refs inlined, no null types)."""
    if "$ref" in schema:
        target = defs[schema["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in schema.items() if k != "$ref"}}
        return structural(merged, defs)
    if "anyOf" in schema:
        variants = [v for v in schema["anyOf"] if v.get("type") != "null"]
        if len(variants) != 1:
            raise UnsupportedSchema(f"a union of several types cannot be structural: {schema['anyOf']}")
        outer = {k: v for k, v in schema.items() if k not in ("anyOf", "default")}
        if schema.get("default") is not None:
            outer["default"] = schema["default"]
        return structural({**variants[0], **outer}, defs)

    out: dict[str, Any] = {k: schema[k] for k in _COPIED if k in schema}
    if "const" in schema:
        out["enum"] = [schema["const"]]
    if schema.get("default") is not None:
        out["default"] = schema["default"]
    if "exclusiveMinimum" in schema:
        out.update(minimum=schema["exclusiveMinimum"], exclusiveMinimum=True)
    if "exclusiveMaximum" in schema:
        out.update(maximum=schema["exclusiveMaximum"], exclusiveMaximum=True)

    kind = schema.get("type")
    if kind == "object" or "properties" in schema:
        out["type"] = "object"
        extra = schema.get("additionalProperties")
        if "properties" in schema:
            out["properties"] = {name: structural(sub, defs) for name, sub in schema["properties"].items()}
            if schema.get("required"):
                out["required"] = list(schema["required"])
            if extra is True:  # named fields plus others (e.g. a volume's source), checked by the model
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict) and extra:
            out["additionalProperties"] = structural(extra, defs)
        else:
            out["x-kubernetes-preserve-unknown-fields"] = True  # free-form (e.g. python transform args)
    elif kind == "array":
        out["type"] = "array"
        out["items"] = structural(schema.get("items", {}), defs)
    elif kind in ("string", "integer", "number", "boolean"):
        out["type"] = kind
    elif not kind:
        out["x-kubernetes-preserve-unknown-fields"] = True
    else:
        raise UnsupportedSchema(f"unsupported JSON schema type {kind!r}")
    return out


def model_schema(model) -> dict[str, Any]:
    schema = model.model_json_schema(by_alias=True, mode="validation")
    return structural(schema, schema.get("$defs", {}))


CRD_API = "apiextensions.k8s.io/v1"
VERSION_ANNOTATION = "sluice.dev/operator-version"  # the sluice release whose model the CRD's schema is
SCHEMA_ANNOTATION = "sluice.dev/schema"  # a hash of its spec: dev builds of one release differ by it


def operator_version() -> str:
    return installed_version("sluice")


def _release(text: str) -> tuple[int, ...]:
    """0.10.2 -> (0, 10, 2); anything else is older than every release."""
    match = re.match(r"^(\d+(?:\.\d+)*)", text or "")
    return tuple(int(part) for part in match.group(1).split(".")) if match else (-1,)


def crd_upgrade(served: Mapping[str, Any] | None, ours: Mapping[str, Any]) -> str | None:
    """Why the served CRD should become ours, None to leave it: ours is from a later release, or from the same
    release with another schema. A CRD of a later release is never taken back (an old replica restarting during
    a rolling upgrade must not undo it); none served is the chart's to install."""
    if served is None:
        return None
    have, want = (dict((c.get("metadata") or {}).get("annotations") or {}) for c in (served, ours))
    have_version, want_version = have.get(VERSION_ANNOTATION, ""), want[VERSION_ANNOTATION]
    have_release, want_release = _release(have_version), _release(want_version)
    if have_release > want_release:
        return None
    if have_release == want_release and have.get(SCHEMA_ANNOTATION) == want[SCHEMA_ANNOTATION]:
        return None
    return (
        f"the served CRD is of sluice {have_version or 'unknown'} (schema {have.get(SCHEMA_ANNOTATION, 'unknown')}); "
        f"this operator's is {want_version} (schema {want[SCHEMA_ANNOTATION]})"
    )


def crd(release: str | None = None) -> dict[str, Any]:
    """The CRD, annotated with the release (default: the installed sluice's) and its schema's hash."""
    body = _crd()
    digest = hashlib.sha256(json.dumps(body["spec"], sort_keys=True).encode()).hexdigest()[:16]
    annotations = {VERSION_ANNOTATION: release or operator_version(), SCHEMA_ANNOTATION: digest}
    body["metadata"]["annotations"] = annotations
    return body


def _crd() -> dict[str, Any]:
    spec_schema = model_schema(StreamingAppSpec)
    spec_schema["description"] = "A streaming app: pipeline, Kafka topics, Spark resources and policies."
    status_schema = model_schema(StreamingAppStatus)
    status_schema["x-kubernetes-preserve-unknown-fields"] = True  # kopf keeps its progress here
    columns = [
        ("Phase", "string", ".status.phase"),
        ("Revision", "string", ".status.revision"),
        ("Rollout", "string", ".status.rollout.phase"),
        ("Executors", "integer", ".status.executors"),
        ("Desired", "integer", ".status.desiredExecutors"),
        ("Scaling", "string", ".status.scaling"),
        ("Lag", "integer", ".status.lag"),
        ("Rate", "string", ".status.inputRate"),
        ("Age", "date", ".metadata.creationTimestamp"),
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": KIND,
                "plural": PLURAL,
                "singular": SINGULAR,
                "shortNames": SHORT_NAMES,
                "listKind": f"{KIND}List",
                "categories": ["sluice"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "required": ["spec"],
                            "properties": {
                                "apiVersion": {"type": "string"},
                                "kind": {"type": "string"},
                                "metadata": {"type": "object"},
                                "spec": spec_schema,
                                "status": status_schema,
                            },
                        }
                    },
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.executors.instances",
                            "statusReplicasPath": ".status.executors",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": [{"name": n, "type": t, "jsonPath": p} for n, t, p in columns],
                }
            ],
        },
    }


class _Yaml11SafeDumper(yaml.SafeDumper):
    """Quotes strings that YAML 1.1 readers (kubectl's) take for booleans, such as y, n, on, off."""


_YAML11_BOOLS = {"y", "n", "yes", "no", "on", "off", "true", "false"}


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "'" if value.lower() in _YAML11_BOOLS else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Yaml11SafeDumper.add_representer(str, _represent_str)


def render() -> str:
    header = "# Generated by `python -m sluice.operator.crd` from sluice.operator.model: do not edit.\n"
    return header + yaml.dump(crd(), Dumper=_Yaml11SafeDumper, sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if args and args[0] == "--write":
        targets = [Path(a) for a in args[1:]] or [CRD_FILE]
        for target in targets:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(render())
            print(f"wrote {target}")
    else:
        sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    sys.exit(main())
