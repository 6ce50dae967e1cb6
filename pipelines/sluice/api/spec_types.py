"""The spec models' shared vocabulary. Their JSON schema becomes the CRD's OpenAPI schema, so a model says
here what the API server checks too: extra fields refused (`Strict`), CEL rules (`cel`), list maps
(`list_map`), and the Kubernetes name and quantity formats."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

DNS_LABEL = StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=63)
Quantity = Annotated[
    str,
    StringConstraints(pattern=r"^[0-9]+(\.[0-9]+)?([kmgtpKMGTP]i?|[kmgtp]b)?$"),
    Field(description="An amount in Spark or Kubernetes notation: 500m, 2, 1g, 512Mi."),
]
TopicName = Annotated[str, StringConstraints(pattern=r"^[a-zA-Z0-9._-]{1,249}$")]
ObjectName = Annotated[
    str,
    StringConstraints(pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$", max_length=253),
    Field(description="A Kubernetes object's name (DNS subdomain)."),
]
SecretKey = Annotated[
    str, StringConstraints(pattern=r"^[-._a-zA-Z0-9]+$", max_length=253), Field(description="A key of the Secret.")
]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def list_map(*keys: str) -> dict[str, Any]:
    """A list the API server (and server-side apply) treats as a map keyed by `keys` (its items' unique names)."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def cel(*rules: str | tuple[str, str], message: str | None = None) -> ConfigDict:
    """Model config carrying CEL rules for the CRD (x-kubernetes-validations) beside the Python checks.

    cel(rule, message) for one rule, or cel((rule, message), ...) for several.
    """
    if rules and isinstance(rules[0], str):
        text = rules[1] if len(rules) > 1 else message or rules[0]
        assert isinstance(text, str), "cel(rule, message): the message is a string"
        pairs = [(rules[0], text)]
    else:
        pairs = list(rules)  # type: ignore[arg-type]
    return ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={"x-kubernetes-validations": [{"rule": rule, "message": msg} for rule, msg in pairs]},
    )
