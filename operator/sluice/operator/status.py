"""What an app's status says (pure): from what a pass observed, its phase, conditions and figures, and whether
the stored status is due to be written over."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, get_args

from sluice.api.app import S3A_SCHEME
from sluice.api.contract import DriverStatus
from sluice.api.times import parse_time

from . import children as ch
from . import names
from . import spark_application as sparkapp
from .desired import KEPT_DEFAULTS, Invalid
from .model import ConditionType, StreamingAppSpec
from .settings import ONE_POD, SHARED

CHECKPOINT_READY = "CheckpointReady"
CONDITION_TYPES = get_args(ConditionType)
# Ready sums these up: the app is valid, its topics and checkpoint store are there, its driver runs and answers with
# its queries running.
READY_FROM = ("Valid", "TopicsReady", CHECKPOINT_READY, "DriverSubmitted", "Running")


@dataclass
class Observation:
    """What the reconciler saw, in plain values."""

    valid: Invalid | None = None
    topics_error: str | None = None
    kafka_error: str | None = None  # the app's Kafka credentials unreadable, or its login refused (names the field)
    topics_pending: dict[str, str] = field(default_factory=dict)  # KafkaTopic -> why Strimzi has not made it Ready
    topics_refused: dict[str, str] = field(default_factory=dict)
    apply_error: str | None = None
    suspended: bool = False
    spark_state: str | None = None  # SparkApplication .status.applicationState.state
    spark_error: str | None = None
    executors: int | None = None  # running executors by the SparkApplication's status
    driver: DriverStatus | None = None  # the driver's own answer (GET /v1/status)
    driver_error: str | None = None
    driver_address: str | None = None  # http://<driver pod IP>:<control port>
    rollout: tuple[bool | None, str, str] | None = None  # the Rollout condition: (status, reason, message)
    driver_failure: str | None = None  # a driver that is not answering: its container's termination message
    driver_unschedulable: str | None = None  # the scheduler's word on a driver pod it cannot place
    lost_submission: str | None = None  # a driver pod spark-operator started and lost track of (observer)
    checkpoint: tuple[bool | None, str, str] | None = None  # the CheckpointReady condition: (status, reason, message)
    checkpoint_claim: sparkapp.ClaimFacts | None = None  # the app's checkpoint claim, read on a full pass


DRIVER_FAILED = "DriverFailed"  # the Running condition's reason when a driver left its error
KAFKA_LOGIN_FAILED = "KafkaLoginFailed"  # TopicsReady's reason: credentials unreadable or refused
TOPIC_NOT_READY = "TopicNotReady"  # TopicsReady's reason: a KafkaTopic Strimzi has not made Ready (yet)
CLAIM_NOT_FOUND = "ClaimNotFound"  # CheckpointReady's reasons that keep a first driver from being submitted
CLAIM_REFUSED = "ClaimAccessModeRefused"
CLAIM_PENDING = "ClaimPending"  # read again on each tick until the claim binds
DRIVER_UNSCHEDULABLE = "DriverUnschedulable"  # the Running condition's reason for a driver pod nowhere to run


def condition_of(status: Mapping[str, Any], kind: str) -> dict[str, Any]:
    """A stored status's condition of that type ({} when it has none)."""
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind), {})


def waits_for_topics(status: Mapping[str, Any]) -> bool:
    """The last full pass found a KafkaTopic not Ready: the next passes look again (a tick is then full)."""
    return condition_of(status, "TopicsReady").get("reason") == TOPIC_NOT_READY


def checkpoint_condition(
    app: str, spec: StreamingAppSpec, claim: sparkapp.ClaimFacts | None, together: bool
) -> tuple[bool | None, str, str]:
    """Where the checkpoints are and whether the driver can use them: an object store (or another Hadoop
    filesystem), or a claim that must exist, allow the executors and bind."""
    root = ch.checkpoint_root(app, spec)
    if spec.checkpoint.is_hadoop_uri():
        return True, "ObjectStore" if root.startswith(S3A_SCHEME) else "HadoopFileSystem", f"checkpoints in {root}"
    name = names.checkpoint_claim_name(app, spec)
    if (claim is None or not claim.exists) and spec.checkpoint.volumeClaim:
        return False, CLAIM_NOT_FOUND, f"spec.checkpoint.volumeClaim: no PersistentVolumeClaim {name}"
    claim = claim or sparkapp.ClaimFacts(str(name), exists=False)  # the operator's, made in this pass: Pending
    if ONE_POD in claim.access_modes and SHARED not in claim.access_modes:
        return (
            False,
            CLAIM_REFUSED,
            (f"spec.checkpoint.volumeClaim: {name} is {ONE_POD}: the executors could not mount it beside the driver"),
        )
    where = " (ReadWriteOnce: the app's pods run on one node)" if together else ""
    if claim.phase != "Bound":
        return False, CLAIM_PENDING, f"claim {name} is {claim.phase or 'Pending'}: no volume bound yet{where}"
    return True, "ClaimBound", f"checkpoints in {root} on claim {name}{where}"


def blocks_first_driver(checkpoint: tuple[bool | None, str, str] | None) -> bool:
    """A checkpoint no driver could use: none is submitted (one that runs keeps running)."""
    return checkpoint is not None and checkpoint[1] in (CLAIM_NOT_FOUND, CLAIM_REFUSED)


def driver_unschedulable(pod: dict[str, Any] | None) -> str | None:
    """The scheduler's message on a driver pod it could not place (its PodScheduled condition)."""
    for condition in ((pod or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return condition.get("message") or condition.get("reason") or "not scheduled"
    return None


def driver_failure(pod: dict[str, Any] | None) -> str | None:
    """The error the driver container left as its termination message (the runner writes "failed at start: " or
    "failed: " and each error's node path), as the status says it: from the container's state when it has
    terminated, else from its last state (it was restarted)."""
    for container in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        if container.get("name") != names.SPARK_CONTAINERS["driver"]:
            continue
        for state in ("state", "lastState"):
            terminated = (container.get(state) or {}).get("terminated") or {}
            message = " ".join((terminated.get("message") or "").split())
            if message:
                return f"driver {message}" if message.startswith("failed") else f"driver terminated: {message}"
    return None


def last_driver_failure(old_status: dict[str, Any], revision: str | None) -> str | None:
    """The driver failure the status tells stands while no driver answers and the revision is the same:
    spark-operator deletes a failed driver's pod before it submits the next (which may fail the same way)."""
    if revision is None or old_status.get("revision") != revision:
        return None
    running = condition_of(old_status, "Running")
    return (running.get("message") or None) if running.get("reason") == DRIVER_FAILED else None


def phase_of(obs: Observation) -> str:
    if obs.valid is not None:
        return "Invalid"
    if obs.suspended:
        return "Suspended"
    state = (obs.spark_state or "").upper()
    if state == "RUNNING":
        return "Running"
    if state in ("FAILED", "SUBMISSION_FAILED", "INVALIDATING") or obs.apply_error:
        return "Failed"
    if state == "COMPLETED":
        return "Completed"
    return "Submitted" if state else "Pending"


def conditions_for(obs: Observation) -> list[dict[str, str]]:
    def cond(kind: str, ok: bool | None, reason: str, message: str = "") -> dict[str, str]:
        status = "Unknown" if ok is None else str(ok)
        return {"type": kind, "status": status, "reason": reason, "message": message}

    if obs.valid is not None:
        return with_ready([cond("Valid", False, "InvalidSpec", obs.valid.message[:4000])], obs)
    topics_ok = not (obs.kafka_error or obs.topics_error or obs.topics_refused or obs.topics_pending)
    pending = "; ".join(f"KafkaTopic {name}: {why}" for name, why in sorted(obs.topics_pending.items()))
    topics_message = obs.kafka_error or obs.topics_error or "; ".join(obs.topics_refused.values()) or pending
    reason = (
        KAFKA_LOGIN_FAILED
        if obs.kafka_error
        else "TopicError"
        if obs.topics_error
        else "PartitionShrinkRefused"
        if obs.topics_refused
        else TOPIC_NOT_READY
        if obs.topics_pending
        else "Ready"
    )
    state = (obs.spark_state or "").upper()
    if obs.suspended:
        submitted = cond("DriverSubmitted", False, "Suspended", "spec.suspend is true")
        running = cond("Running", False, "Suspended")
    elif obs.apply_error:
        submitted = cond("DriverSubmitted", False, "ApplyFailed", obs.apply_error[:4000])
        running = cond("Running", False, "NotSubmitted")
    elif obs.driver_failure:
        submitted = cond("DriverSubmitted", True, "Submitted")
        running = cond("Running", False, DRIVER_FAILED, obs.driver_failure[:4000])
    elif obs.driver_unschedulable:
        submitted = cond("DriverSubmitted", True, "Submitted")
        running = cond("Running", False, DRIVER_UNSCHEDULABLE, obs.driver_unschedulable[:4000])
    else:
        submitted = cond("DriverSubmitted", True, "Submitted")
        running = cond(
            "Running",
            state == "RUNNING" if state else None,
            state.title().replace("_", "") or "Pending",
            obs.spark_error or "",
        )
    rollout = [cond("Rollout", *obs.rollout)] if obs.rollout else []
    checkpoint = [cond(CHECKPOINT_READY, *obs.checkpoint)] if obs.checkpoint else []
    topics = cond("TopicsReady", topics_ok, reason, topics_message)
    return with_ready([cond("Valid", True, "Valid"), topics, *checkpoint, submitted, running], obs, *rollout)


def with_ready(conditions: list[dict[str, str]], obs: Observation, *after: dict[str, str]) -> list[dict[str, str]]:
    """Ready first (what `kubectl wait --for=condition=Ready` and GitOps health checks read): True while the app
    processes records — every condition of READY_FROM True and the driver answering with its queries running;
    else the first that is not, with its reason and message. A rollout does not make it unready: the stable
    revision runs meanwhile."""
    blocking = next((c for c in conditions if c["type"] in READY_FROM and c["status"] != "True"), None)
    if blocking is None and (obs.driver is None or obs.driver.state != "running"):
        state = obs.driver.state if obs.driver is not None else None
        why = f"the driver's queries are {state}" if state else "the driver has not answered yet"
        blocking = {"status": "False", "reason": "DriverNotProcessing", "message": why}
    if blocking is None:
        ready = {"type": "Ready", "status": "True", "reason": "Processing", "message": ""}
    else:
        status = "False" if blocking["status"] == "False" else "Unknown"
        ready = {"type": "Ready", "status": status, "reason": blocking["reason"], "message": blocking["message"]}
    return [ready, *conditions, *after]


def merge_conditions(
    old: list[dict[str, Any]], new: list[dict[str, str]], now: str, generation: int | None = None
) -> list[dict[str, Any]]:
    """Keep lastTransitionTime when a condition's status did not change; each says the generation it is of."""
    before = {c.get("type"): c for c in old or []}
    merged = []
    for condition in new:
        previous = before.get(condition["type"])
        since = now
        if previous is not None and previous.get("status") == condition["status"]:
            since = previous.get("lastTransitionTime", now)
        merged.append({**condition, "observedGeneration": generation, "lastTransitionTime": since})
    return merged


def driver_figures(driver: DriverStatus) -> dict[str, Any]:
    """Status fields from the driver's answer. Queries reading the same topics (a sink query and its
    dead-letter query) are counted once for the input rate, as the backlog counts each topic once."""
    rate_by_topics: dict[tuple[str, ...], float] = {}
    for query in driver.queries:
        key = tuple(sorted(query.topics)) or (query.name,)
        rate_by_topics[key] = max(rate_by_topics.get(key, 0.0), query.inputRowsPerSecond or 0.0)
    return {
        "executors": len(driver.executors),
        "lag": driver.backlog,
        "inputRate": f"{sum(rate_by_topics.values()):.1f}/s",
        "observedAt": driver.observedAt,
    }


# What a tick reads from a running driver: they change nearly every tick, so they alone are written at most every
# status_figures_seconds (Settings). Everything else in the status (phase, conditions, the live executor count,
# an autoscaler decision) is written as soon as it changes.
STATUS_FIGURES = frozenset({"lag", "inputRate", "observedAt"})
AUTOSCALER_FIGURES = frozenset({"backlog", "ratePerExecutor", "message"})


def replacing(old: Any, new: Any) -> Any:
    """`new` as a JSON merge patch must write it to replace `old` wholly: a merge patch keeps what it does not
    name, so every key of `old` that `new` lacks, at any depth, is set to null (a new rollout must not keep the
    last one's finishedAt, message or fromCheckpoints)."""
    if not isinstance(old, dict) or not isinstance(new, dict):
        return new
    return {**dict.fromkeys(old.keys() - new.keys()), **{k: replacing(old.get(k), v) for k, v in new.items()}}


def _as_stored(value: Any) -> Any:
    """A value as a JSON merge patch leaves it: a None in a dict deletes its key."""
    if isinstance(value, dict):
        return {k: _as_stored(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_as_stored(v) for v in value]
    return value


def _beyond_figures(status: dict[str, Any], keys: Iterable[str]) -> dict[str, Any]:
    kept = {key: _as_stored(status.get(key)) for key in keys if key not in STATUS_FIGURES}
    if isinstance(kept.get("autoscaler"), dict):
        kept["autoscaler"] = {k: v for k, v in kept["autoscaler"].items() if k not in AUTOSCALER_FIGURES}
    return kept


def status_write_due(old: dict[str, Any], new: dict[str, Any], figures_every: float) -> bool:
    """Whether a pass's status is to be written over the stored one: at once when anything but the driver's
    figures changed, or the figures appeared or went; figures alone once `figures_every` seconds have passed
    between the stored and the new observedAt (the driver's clock: a new driver's clock behind the stored time
    writes at once too)."""
    if all(_as_stored(old.get(key)) == _as_stored(value) for key, value in new.items()):
        return False
    if _beyond_figures(old, new) != _beyond_figures(new, new):
        return True
    stored, observed = old.get("observedAt"), new.get("observedAt")
    if stored is None or observed is None:
        return True
    try:
        age = parse_time(observed) - parse_time(stored)
    except (TypeError, ValueError):  # a stored observedAt edited by hand
        return True
    return age >= figures_every or age < 0


def status_for(
    obs: Observation,
    *,
    generation: int | None,
    revision: str | None,
    children: list[dict[str, Any]],
    old_status: dict[str, Any],
    now: str,
    scaling: dict[str, Any] | None = None,
    rollout: dict[str, Any] | None = None,
    selector: str | None = None,
    kept: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The whole status, every field written (None clears it, also inside a field's object: `replacing`):
    nothing stale survives a stopped driver or a finished rollout.
    `selector`: the executors' label selector (the scale subresource's labelSelectorpath).
    `scaling`: desiredExecutors, scaling and autoscaler, decided by the reconciler's scaling step; `rollout`:
    stableRevision, rollout, checkpoints and driver, by its rollout step. `kept`: the defaults the app runs on
    (desired.kept_defaults: its checkpoint location, image and Spark version), kept from then on."""
    status: dict[str, Any] = {
        "phase": phase_of(obs),
        "observedGeneration": generation,
        "conditions": merge_conditions(old_status.get("conditions", []), conditions_for(obs), now, generation),
        "selector": selector,
        "children": [
            {"apiVersion": c["apiVersion"], "kind": c["kind"], "name": c["metadata"]["name"]} for c in children
        ],
        "message": (
            obs.valid.message[:4000]
            if obs.valid
            else obs.apply_error
            or obs.kafka_error
            or obs.topics_error
            or "; ".join(obs.topics_refused.values())
            or (obs.driver_failure or "")[:4000]
            or None
        ),
        "revision": revision,
        "stableRevision": (rollout or {}).get("stableRevision", old_status.get("stableRevision")),
        "rollout": (rollout or {}).get("rollout", old_status.get("rollout")),
        "checkpoints": (rollout or {}).get("checkpoints", old_status.get("checkpoints")),
        **{key: (kept or {}).get(key) or old_status.get(key) for key in KEPT_DEFAULTS},
        "driver": (rollout or {}).get("driver", old_status.get("driver")),
        "executors": None,
        "lag": None,
        "inputRate": None,
        "observedAt": None,
        "desiredExecutors": None,
        "scaling": None,
        "autoscaler": None,
    }
    if obs.valid is not None:
        status["revision"] = old_status.get("revision")  # what runs keeps running
        return _replacing_fields(old_status, status)
    if obs.suspended:
        status["executors"] = 0
    elif obs.driver is not None:
        status.update(driver_figures(obs.driver))
    elif obs.executors is not None:
        status["executors"] = obs.executors
    status.update(scaling or {})
    return _replacing_fields(old_status, status)


def _replacing_fields(old_status: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    return {key: replacing(old_status.get(key), value) for key, value in status.items()}
