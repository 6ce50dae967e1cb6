"""The validating admission webhook: a StreamingApp the operator would mark Invalid is refused at apply.

The checks are the operator's own (desired.admissible_spec with this operator's settings), so
`kubectl apply` and the Valid condition never disagree; what only the cluster can tell (a missing Secret
or Kafka cluster) stays with the reconciler.

Importing this module registers the handler, and kopf then refuses to start without
`settings.admission.server`: `python -m sluice.operator --webhook-port` imports it and sets the server.
The server runs in every replica, standby peers included (kopf pauses only the resource handlers), so
the chart's Service may send a review to any of them. The chart owns the ValidatingWebhookConfiguration
and the certificate (the same for every replica); the operator neither creates nor patches them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kopf

from .desired import Invalid, admissible_spec
from .model import GROUP, PLURAL, VERSION
from .settings import SETTINGS

WEBHOOK_ID = "validate-streamingapp"
WEBHOOK_PATH = f"/{WEBHOOK_ID}"  # kopf routes a review by its path to the handler of that id
DENIED_CODE = 422  # Unprocessable Entity, as for a spec the CRD schema refuses
VALIDATED_OPERATIONS: tuple[kopf.Operation, ...] = ("CREATE", "UPDATE")


@kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_ID, operations=list(VALIDATED_OPERATIONS))
def refuse_invalid_app(
    body: kopf.Body,
    old: kopf.Body | None = None,
    operation: str | None = None,
    namespace: str | None = None,
    **_: Any,
) -> None:  # kopf passes old and operation, though its WebhookFn does not name them
    if operation not in VALIDATED_OPERATIONS:
        return
    spec = body.get("spec") or {}
    # Finalizers, annotations and labels change without the spec; an app accepted before the webhook
    # existed must still be deletable and handled.
    if operation == "UPDATE" and old is not None and old.get("spec") == spec:
        return
    invalid = admissible_spec(dict(spec), SETTINGS, namespace)
    if isinstance(invalid, Invalid):
        # kubectl prints it after `admission webhook "…" denied the request: `.
        raise kopf.AdmissionError(invalid.message, code=DENIED_CODE)


def webhook_server(port: int, cert_dir: Path, addr: str = "0.0.0.0") -> kopf.WebhookServer:
    """HTTPS on addr:port with cert_dir/tls.crt and tls.key (a kubernetes.io/tls Secret's keys); kopf
    re-reads them when they change (cert-manager renewals)."""
    return kopf.WebhookServer(
        addr=addr, port=port, certfile=str(cert_dir / "tls.crt"), pkeyfile=str(cert_dir / "tls.key")
    )
