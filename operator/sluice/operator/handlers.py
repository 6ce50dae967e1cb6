"""kopf handlers: thin. They hand the object to the reconciler and patch the status it returns."""

from __future__ import annotations

import logging
import os
from collections import Counter
from typing import Any

import kopf

from . import metrics
from .model import GROUP, PLURAL, VERSION
from .reconciler import Reconciler

RESOURCE = (GROUP, VERSION, PLURAL)
RESYNC_SECONDS = float(os.environ.get("SLUICE_RESYNC_SECONDS", "30"))
_phases: dict[str, str] = {}  # uid -> phase, for the apps-by-phase gauge


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = "sluice.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="sluice.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="sluice.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.execution.max_workers = int(os.environ.get("SLUICE_WORKERS", "8"))
    memo.reconciler = Reconciler()


def _reconcile(trigger: str, body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo,
               logger: kopf.Logger) -> None:
    with metrics.RECONCILE_SECONDS.labels(trigger).time():
        try:
            status = memo.reconciler.reconcile(dict(body))
        except Exception:
            metrics.RECONCILE_ERRORS.labels(trigger).inc()
            raise
    metrics.RECONCILES.labels(trigger, status["phase"]).inc()
    _phases[body["metadata"]["uid"]] = status["phase"]
    for phase, count in Counter(_phases.values()).items():
        metrics.APPS.labels(phase).set(count)
    previous = (body.get("status") or {}).get("phase")
    if status["phase"] == "Invalid" and (previous != "Invalid" or trigger != "resync"):
        kopf.warn(body, reason="InvalidSpec", message=status["message"] or "invalid spec")
    elif status["phase"] != previous:
        logger.info("phase %s -> %s (revision %s)", previous, status["phase"], status.get("revision"))
    patch.status.update(status)


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
@kopf.on.resume(*RESOURCE)
def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, reason: str,
              **_: Any) -> None:
    _reconcile(str(reason), body, patch, memo, logger)


@kopf.timer(*RESOURCE, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, backoff=min(RESYNC_SECONDS, 10))
def resync(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    """Repairs drift and refreshes the status from the driver."""
    _reconcile("resync", body, patch, memo, logger)


def _deletes_topics(spec: kopf.Spec, **_: Any) -> bool:
    return any(t.get("deletionPolicy") == "delete" for t in spec.get("topics") or [])


# A finalizer only for what garbage collection cannot do: Kafka topics deleted through the Admin API.
@kopf.on.delete(*RESOURCE, when=_deletes_topics)
def delete_topics(spec: kopf.Spec, namespace: str, memo: kopf.Memo, body: kopf.Body, **_: Any) -> None:
    memo.reconciler.delete_topics(dict(spec), namespace)
    _phases.pop(body["metadata"]["uid"], None)
