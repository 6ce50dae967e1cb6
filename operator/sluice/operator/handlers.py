"""kopf handlers: thin. They hand the app to the reconciler, which reads it afresh and patches what changed, one
pass per app at a time (a pass that read the app before another's status landed would write an older rollout back).

Periodic work is two kopf timers (so kopf's peering pauses them on a standby replica, and a suspended app
carries no finalizer for them). The tick runs only while there is something to poll: a running driver, which
it observes and scales (the autoscaler, or re-asserting the count after a driver restart), or a rollout in
progress; an app without a running driver hears of one from its SparkApplication's events, so it costs no
API requests between them. The resync, every RESYNC_SECONDS for every app not suspended, is a full pass
that repairs what no event reports (a topic deleted in Kafka, a child deleted while the watch was down).
Drift of the children is repaired from their own watch events.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import logging
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import kopf

from . import (
    api_session,  # noqa: F401  (registers kopf's login: a bound on its concurrent requests)
    metrics,
)
from .kube import KubeError
from .memory import TRIMMER
from .model import GROUP, PLURAL, TERMINAL_PHASES, VERSION
from .names import APP_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from .reconciler import Outcome, Reconciler
from .settings import SETTINGS
from .status import waits_for_topics

RESOURCE = (GROUP, VERSION, PLURAL)
log = logging.getLogger("sluice.operator")
RESYNC_SECONDS = SETTINGS.resync_seconds
TICK_SECONDS = SETTINGS.tick_seconds
# Per watched kind (and namespace), kopf keeps a worker for each object with events to handle, by default without
# limit: in a burst of 950 new apps (and their children's events) thousands held their bodies at once, and the
# heap they fragmented stayed (RSS at rest 159 -> 129 MB at 1,000 apps with a limit). A worker keeps its slot
# until its object has had no event for WORKER_IDLE_SECONDS, so a kind gets through about
# KOPF_WORKER_LIMIT / WORKER_IDLE_SECONDS objects a second: 320, the status changes of 1,600 running apps
# (one per tick each). Objects whose handler keeps failing keep their slots while kopf retries them; the
# timers, outside the limit, still reconcile every app.
WORKER_IDLE_SECONDS = 0.2
KOPF_WORKER_LIMIT = 8 * SETTINGS.workers
# The resyncs of apps created together come due together (a burst of 1,000 apps: 14 full passes a second for a
# minute). In the handlers' pool they queued ahead of every new app's and changed spec's pass; on threads of their
# own (a quarter of the SLUICE_WORKERS passes at once, the handlers the rest) they wait for each other, and each
# app's next resync waits for its last.
RESYNC_WORKERS = max(1, SETTINGS.workers // 4)
HANDLER_WORKERS = max(1, SETTINGS.workers - RESYNC_WORKERS)
CHILD_KINDS = [
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("", "v1", "serviceaccounts"),
    ("rbac.authorization.k8s.io", "v1", "rolebindings"),
    ("networking.k8s.io", "v1", "networkpolicies"),
    ("sparkoperator.k8s.io", "v1beta2", "sparkapplications"),
]
_phases: dict[str, str] = {}  # app -> phase, for the apps-by-phase gauge


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.persistence.finalizer = "sluice.dev/finalizer"
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="sluice.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="sluice.dev", key="last-handled-configuration"
    )
    settings.posting.level = logging.WARNING
    settings.watching.server_timeout = 300
    settings.queueing.idle_timeout = WORKER_IDLE_SECONDS  # kopf's default: 5 s
    settings.execution.max_workers = HANDLER_WORKERS
    settings.queueing.worker_limit = KOPF_WORKER_LIMIT
    for kind in CHILD_KINDS:  # only ours: the API server filters, so kopf keeps nothing of the others
        settings.watching.label_selectors[kind] = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
    memo.reconciler = Reconciler()
    if SETTINGS.upgrade_crd:
        _upgrade_crd(memo.reconciler)
    TRIMMER.start()
    memo.apps = set()  # apps this replica has handled: child events of others wait for their handler


def _upgrade_crd(reconciler: Reconciler) -> None:
    """Before any app is watched, the served CRD becomes this operator's (Helm never upgrades a chart's CRDs): a
    status field it writes is then one the API server keeps."""
    try:
        why = reconciler.cluster.upgrade_crd()
    except KubeError as exc:
        log.warning("the StreamingApp CRD is as served (%s): apply charts/sluice/crds/ by hand if it is older", exc)
        return
    if why is not None:
        log.info("StreamingApp CRD updated: %s", why)


def _record(trigger: str, outcome: Outcome, body: kopf.Body) -> None:
    meta = body["metadata"]
    app = f"{meta['namespace']}/{meta['name']}"
    status = outcome.status
    metrics.RECONCILES.labels(trigger, status["phase"]).inc()
    _phases[app] = status["phase"]
    metrics.APPS.clear()
    for phase, count in Counter(_phases.values()).items():
        metrics.APPS.labels(phase).set(count)
    metrics.record_app(meta["namespace"], meta["name"], status, (reason for _, reason, _ in outcome.events))
    for kind in outcome.scaling_kinds:
        metrics.SCALING_DECISIONS.labels(kind).inc()
    for event_type, reason, message in outcome.events:
        kopf.event(body, type=event_type, reason=reason, message=message)
    TRIMMER.after_pass()


@kopf.on.create(*RESOURCE)
@kopf.on.update(*RESOURCE, field="spec")
@kopf.on.resume(*RESOURCE)
def reconcile(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, reason: str, **_: Any) -> None:
    trigger = str(reason)
    meta = body["metadata"]
    with metrics.RECONCILE_SECONDS.labels(trigger).time():
        try:
            outcome = memo.reconciler.reconcile_by_name(meta["namespace"], meta["name"])
        except Exception:
            metrics.RECONCILE_ERRORS.labels(trigger).inc()
            raise
    if outcome is None:  # deleted meanwhile
        return
    memo.apps.add((meta["namespace"], meta["name"]))
    _record(trigger, outcome, body)
    status, previous = outcome.status, (body.get("status") or {}).get("phase")
    if status["phase"] == "Invalid":
        kopf.warn(body, reason="InvalidSpec", message=status["message"] or "invalid spec")
    elif status["phase"] != previous:
        logger.info("phase %s -> %s (revision %s)", previous, status["phase"], status.get("revision"))


def _not_suspended(spec: kopf.Spec, **_: Any) -> bool:
    return not spec.get("suspend")


def _polls(spec: kopf.Spec, status: kopf.Status, **_: Any) -> bool:
    """A tick has a driver to observe and scale, or a rollout to move on (as the last pass recorded them)."""
    rollout = status.get("rollout") or {}
    busy = bool(rollout) and rollout.get("phase") not in TERMINAL_PHASES
    return _not_suspended(spec) and (status.get("phase") == "Running" or busy or waits_for_topics(status))


@kopf.timer(*RESOURCE, interval=TICK_SECONDS, initial_delay=TICK_SECONDS, when=_polls)
def tick(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    _periodic("tick", body, memo, full=False)


RESYNC_POOL = ThreadPoolExecutor(max_workers=RESYNC_WORKERS, thread_name_prefix="sluice-resync")


@kopf.timer(*RESOURCE, interval=RESYNC_SECONDS, initial_delay=RESYNC_SECONDS, when=_not_suspended)
async def resync(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    full_pass = functools.partial(_periodic, "resync", body, memo, full=True)
    # kopf's context goes along (kopf.event from the pass needs it), as kopf's own pool gives it to a handler.
    await asyncio.get_running_loop().run_in_executor(RESYNC_POOL, contextvars.copy_context().run, full_pass)


def _periodic(trigger: str, body: kopf.Body, memo: kopf.Memo, *, full: bool) -> None:
    """The tick (periodic: the only pass that runs the autoscaler) or the resync (a full pass)."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    with metrics.RECONCILE_SECONDS.labels(trigger).time():
        try:
            outcome = memo.reconciler.reconcile_by_name(*key, full=full, periodic=not full)
        except Exception:  # reported; the next one tries again
            metrics.RECONCILE_ERRORS.labels(trigger).inc()
            raise
    if outcome is None:
        return
    memo.apps.add(key)
    _record(trigger, outcome, body)


def _deleted(event: kopf.RawEvent, **_: Any) -> bool:
    return event["type"] == "DELETED"


# Filtered and async: every status change of every app is an event here, and neither a call nor a thread of the
# handlers' pool (the passes') is spent on one. With 1,000 apps patching their status each tick while a wave of
# resyncs filled the pool, the events queued behind the passes, kopf's per-object workers kept their slots, and a
# new app's creation waited over 2 minutes for one (make bench-operator).
@kopf.on.event(*RESOURCE, when=_deleted)
async def forget_deleted(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    meta = body["metadata"]
    memo.apps.discard((meta["namespace"], meta["name"]))
    _phases.pop(f"{meta['namespace']}/{meta['name']}", None)
    metrics.forget_app(meta["namespace"], meta["name"])


def _drifted(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> bool:
    """A child of an app this replica handles was edited or deleted. Checked in the event loop, so the burst of
    creations (ours) never waits for a worker thread."""
    meta = body["metadata"]
    app = meta.get("labels", {}).get(APP_LABEL)
    return event["type"] in ("MODIFIED", "DELETED") and app is not None and (meta["namespace"], app) in memo.apps


def _child_event(body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child was edited or deleted (by hand, or by its controller): bring its app back to the spec."""
    meta = body["metadata"]
    app = meta["labels"][APP_LABEL]
    with metrics.RECONCILE_SECONDS.labels("child").time():
        outcome = memo.reconciler.reconcile_by_name(meta["namespace"], app)
    if outcome is not None:
        owner: kopf.RawBody = {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "StreamingApp",
            "metadata": {"namespace": meta["namespace"], "name": app},
        }
        uid = _owner_uid(meta, app)
        if uid is not None:  # else the event names the app without it
            owner["metadata"]["uid"] = uid
        _record("child", outcome, kopf.Body(owner))


def _owner_uid(meta: dict[str, Any], app: str) -> str | None:
    return next((ref.get("uid") for ref in meta.get("ownerReferences") or [] if ref.get("name") == app), None)


for _group, _version, _plural in CHILD_KINDS:
    kopf.on.event(_group, _version, _plural, id=f"child-{_plural}", when=_drifted)(_child_event)


def _deletes_topics(spec: kopf.Spec, **_: Any) -> bool:
    return any(t.get("deletionPolicy") == "delete" for t in spec.get("topics") or [])


# A finalizer only for what garbage collection cannot do: Kafka topics deleted through the Admin API.
@kopf.on.delete(*RESOURCE, when=_deletes_topics)
def delete_topics(spec: kopf.Spec, namespace: str | None, memo: kopf.Memo, **_: Any) -> None:
    assert namespace is not None  # StreamingApps are namespaced
    memo.reconciler.delete_topics(dict(spec), namespace)
