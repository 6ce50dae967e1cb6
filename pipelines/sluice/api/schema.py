"""The StreamingApp manifest as a JSON Schema, for editors (yaml-language-server) and tools: `sluice schema`.

Generated from the same model as the CRD's schema and the validation, so the three never disagree; the CRD
adds only what Kubernetes itself checks (CEL rules) and the status.
"""

from __future__ import annotations

from typing import Any

from .app import API_VERSION, KIND, StreamingAppSpec

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def manifest_schema() -> dict[str, Any]:
    """A whole StreamingApp manifest: apiVersion, kind, metadata (name, namespace, labels, annotations) and spec."""
    spec = StreamingAppSpec.model_json_schema(ref_template="#/$defs/{model}")
    definitions = spec.pop("$defs", {})
    return {
        "$schema": SCHEMA_DIALECT,
        "$id": f"https://sluice.dev/schemas/{API_VERSION}/{KIND}.json",
        "title": KIND,
        "description": "A sluice streaming app: its pipeline, Kafka topics, Spark resources and policies.",
        "type": "object",
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "properties": {
            "apiVersion": {"const": API_VERSION},
            "kind": {"const": KIND},
            "metadata": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "namespace": {"type": "string"},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
            "spec": spec,
        },
        "$defs": definitions,
    }
