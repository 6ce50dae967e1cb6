"""kopf handlers: thin. They hand the app to the reconciler and patch the status it returns.

No per-app timer or daemon: kopf would put a finalizer on every app for them, and an app could then not
be deleted without the operator. Drift is repaired from the children's own watch events instead, and a
resync loop re-reconciles the apps this replica has handled (a standby replica handles none).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import Counter
from typing import Any

import kopf

from . import metrics
from .children import APP_LABEL, MANAGED_BY
from .model import GROUP, PLURAL, VERSION
from .reconciler import Reconciler

RESOURCE = (GROUP, VERSION, PLURAL)
RESYNC_SECONDS = float(os.environ.get("SLUICE_RESYNC_SECONDS", "30"))
CHILD_KINDS = [("", "v1", "configmaps"), ("", "v1", "services"), ("", "v1", "serviceaccounts"),
               ("rbac.authorization.k8s.io", "v1", "roles"), ("rbac.authorization.k8s.io", "v1", "rolebindings"),
               ("sparkoperator.k8s.io", "v1beta2", "sparkapplications")]
_phases: dict[str, str] = {}  # uid -> phase, for the apps-by-phase gauge


class Resync:
    """Re-reconciles, every RESYNC_SECONDS, the apps this replica has handled: repairs what no event
    reports (a topic deleted in Kafka) and refreshes the status from the driver's metrics."""

    def __init__(self, reconciler: Reconciler, interval: float) -> None:
        self.reconciler = reconciler
        self.interval = interval
        self.apps: set[tuple[str, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sluice-resync", daemon=True)

    def start(self) -> Resync:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        log = logging.getLogger("sluice.operator.resync")
        while not self._stop.wait(self.interval):
            for namespace, name in sorted(self.apps):
                try:
                    status = self.reconciler.reconcile_by_name(namespace, name)
                except Exception:  # one broken app must not stop the others' resync
                    metrics.RECONCILE_ERRORS.labels("resync").inc()
                    log.exception("resync of %s/%s failed", namespace, name)
                    continue
                if status is None:
                    self.apps.discard((namespace, name))
                else:
                    _record("resync", status, f"{namespace}/{name}")


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
    memo.resync = Resync(memo.reconciler, RESYNC_SECONDS).start()


@kopf.on.cleanup()
def shutdown(memo: kopf.Memo, **_: Any) -> None:
    memo.resync.stop()


def _record(trigger: str, status: dict[str, Any], app: str) -> None:
    metrics.RECONCILES.labels(trigger, status["phase"]).inc()
    _phases[app] = status["phase"]
    metrics.APPS.clear()
    for phase, count in Counter(_phases.values()).items():
        metrics.APPS.labels(phase).set(count)


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
@kopf.on.resume(*RESOURCE)
def reconcile(body: kopf.Body, patch: kopf.Patch, memo: kopf.Memo, logger: kopf.Logger, reason: str,
              **_: Any) -> None:
    trigger = str(reason)
    with metrics.RECONCILE_SECONDS.labels(trigger).time():
        try:
            status = memo.reconciler.reconcile(dict(body))
        except Exception:
            metrics.RECONCILE_ERRORS.labels(trigger).inc()
            raise
    meta = body["metadata"]
    memo.resync.apps.add((meta["namespace"], meta["name"]))
    _record(trigger, status, f"{meta['namespace']}/{meta['name']}")
    previous = (body.get("status") or {}).get("phase")
    if status["phase"] == "Invalid":
        kopf.warn(body, reason="InvalidSpec", message=status["message"] or "invalid spec")
    elif status["phase"] != previous:
        logger.info("phase %s -> %s (revision %s)", previous, status["phase"], status.get("revision"))
    patch.status.update(status)


@kopf.on.event(*RESOURCE)
def forget_deleted(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    if event["type"] == "DELETED":
        meta = body["metadata"]
        memo.resync.apps.discard((meta["namespace"], meta["name"]))
        _phases.pop(f"{meta['namespace']}/{meta['name']}", None)


def _child_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child was edited or deleted (by hand, or by its controller): bring its app back to the spec."""
    if event["type"] not in ("MODIFIED", "DELETED"):
        return
    meta = body["metadata"]
    app = (meta.get("labels") or {}).get(APP_LABEL)
    if app and (meta["namespace"], app) in memo.resync.apps:
        with metrics.RECONCILE_SECONDS.labels("child").time():
            status = memo.reconciler.reconcile_by_name(meta["namespace"], app)
        if status is not None:
            _record("child", status, f"{meta['namespace']}/{app}")


for _group, _version, _plural in CHILD_KINDS:
    kopf.on.event(_group, _version, _plural, id=f"child-{_plural}",
                  labels={"app.kubernetes.io/managed-by": MANAGED_BY})(_child_event)


def _deletes_topics(spec: kopf.Spec, **_: Any) -> bool:
    return any(t.get("deletionPolicy") == "delete" for t in spec.get("topics") or [])


# A finalizer only for what garbage collection cannot do: Kafka topics deleted through the Admin API.
@kopf.on.delete(*RESOURCE, when=_deletes_topics)
def delete_topics(spec: kopf.Spec, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    memo.reconciler.delete_topics(dict(spec), namespace)
