"""The rollout's actions carried out (I/O), one method per action type of rollout.actions: on the API server (a
revision's ConfigMap, a handover's second driver, a driver deleted) and on the drivers' control API (a swap, a
drain, an activation, a resume, checkpoint folders deleted). Also the restart of a driver found running another
revision than its runner config says (rollout.decide.driver_behind)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Literal

from sluice.api.contract import Migration, RunnerConfig, StateResponse, SwapRequest, in_app

from . import children as ch
from . import names
from . import spark_application as sparkapp
from .cluster import Cluster, adopt
from .driver_client import DriverClient, DriverRefused, DriverUnavailable
from .model import StreamingAppSpec
from .observer import Drivers
from .rollout import (
    Activate,
    ApplyRevision,
    DeleteDriver,
    Drain,
    DriverFacts,
    Observed,
    QueryFacts,
    ReleaseRevision,
    Resume,
    StartDriver,
    SwapQueries,
    classify,
)
from .rollout.decide import (
    RolloutDecision,
    app_driver,
    on_standby,
    pending_swap,
    revision_checkpoints,
    with_driver_state,
    with_refused_swap,
)
from .settings import ClaimDefaults
from .status import Observation

log = logging.getLogger("sluice.operator")
Events = list[tuple[str, str, str]]  # (type, reason, message)


def resubmit_lost(cluster: Cluster, namespace: str, app: str, pod: str) -> tuple[str, str, str]:
    """A driver pod spark-operator lost the submission of (observer.lost_submission) deleted: spark-operator then
    submits its driver again. The Warning event that says so."""
    cluster.delete("v1", "Pod", namespace, pod)
    message = (
        f"spark-operator left the driver's SparkApplication in PENDING_RERUN though driver pod {pod} runs (its "
        "submission's status was lost, kubeflow/spark-operator#2905): the pod is deleted, spark-operator submits "
        "the driver again"
    )
    log.warning("%s/%s: %s", namespace, app, message)
    return ("Warning", "DriverResubmitted", message)


@dataclass
class RolloutContext:
    """One pass's rollout as its actions need it. `facts`: the app's driver as observed (not as a refused swap
    makes the decision see it): what a swap still has to ask for; `specs`: the revisions' specs read so far."""

    owner: dict[str, Any]
    decision: RolloutDecision
    specs: dict[str, StreamingAppSpec]
    obs: Observation
    facts: DriverFacts
    stable_checkpoints: dict[str, str]
    drivers: Drivers
    recorded_driver: str
    events: Events

    @property
    def namespace(self) -> str:
        return str(self.owner["metadata"]["namespace"])

    @property
    def app(self) -> str:
        return str(self.owner["metadata"]["name"])

    def folders(self, revision: str) -> tuple[dict[str, str], dict[str, Migration]]:
        """Where a driver running `revision` keeps its queries' checkpoints as the rollout places them."""
        return revision_checkpoints(revision, self.stable_checkpoints, self.decision.step.rollout)

    def app_driver(self) -> str:
        return app_driver(self.decision.step.rollout, self.recorded_driver)


class RolloutActions:
    def __init__(self, cluster: Cluster, driver_client: DriverClient, claims: ClaimDefaults | None = None) -> None:
        self.cluster = cluster
        self.driver_client = driver_client
        self.claims = claims or ClaimDefaults()
        self._pipelines_differ: dict[tuple[str, str, str, str], bool] = {}

    def carry_out(self, ctx: RolloutContext, observed: Observed) -> Observed | None:
        """The decision's actions; returns the observation as the drivers' answers changed it (a refused swap, a
        drain or an activation done), None when nothing changed."""
        changed: Observed | None = None
        for action in ctx.decision.step.actions:
            if isinstance(action, SwapQueries):
                refusal = self.swap(ctx, action)
                if refusal is not None:
                    return with_refused_swap(changed or observed, action, refusal)
            elif isinstance(action, Activate | Resume | Drain):
                changed = self.set_driver_state(ctx, action, changed or observed) or changed
            elif isinstance(action, ApplyRevision):
                self.apply_revision(ctx, action, observed)
            elif isinstance(action, StartDriver):
                self.start_driver(ctx, action)
            elif isinstance(action, DeleteDriver):
                if action.driver != ctx.app_driver():
                    self.cluster.delete_driver(ctx.namespace, action.driver)
            elif isinstance(action, ReleaseRevision):  # the revision's ConfigMap is pruned with the children
                if action.retired_folders:
                    address = ctx.drivers.addresses.get(ctx.app_driver(), ctx.obs.driver_address)
                    self.delete_checkpoints(ctx, action.retired_folders, address)
            else:
                log.warning("%s/%s: %s is not carried out by this operator", ctx.namespace, ctx.app, action)
        return changed

    # ------------------------------------------------------------------------------ actions
    def apply_revision(self, ctx: RolloutContext, action: ApplyRevision, observed: Observed) -> None:
        spec = self.cluster.revision_spec(ctx.namespace, ctx.app, action.revision, ctx.specs)
        if spec is not None and action.revision not in observed.revisions:
            self.cluster.apply_revision(ctx.owner, spec, self.cluster.bootstrap(spec, ctx.namespace))

    def swap(self, ctx: RolloutContext, action: SwapQueries) -> str | None:
        """Ask the driver to run the swap's revision, unless it does; returns the driver's refusal."""
        obs = ctx.obs
        if obs.driver is None or obs.driver_address is None:
            return None
        steps = pending_swap(action, ctx.facts)
        if steps is None:
            return None
        config = self.revision_config(ctx, action.revision)
        if config is None:
            return f"the spec of revision {action.revision} is gone (its ConfigMap was deleted)"
        token = self.cluster.control_token(ctx.namespace, ctx.app)
        if token is None:
            ctx.events.append(
                ("Warning", "SwapFailed", f"no control token in Secret {names.control_secret_name(ctx.app)}")
            )
            return None
        try:
            answer = self.driver_client.swap(obs.driver_address, token, SwapRequest(config=config, steps=list(steps)))
        except DriverRefused as exc:
            return in_app(str(exc))
        except DriverUnavailable as exc:
            self.cluster.forget_token(ctx.namespace, ctx.app)
            ctx.events.append(("Warning", "SwapFailed", str(exc)[:1000]))
            return None
        done = [
            f"{what} {', '.join(names)}"
            for what, names in (
                ("restarted", answer.restarted),
                ("moved to a checkpoint of their own", answer.moved),
                ("started", answer.started),
                ("stopped", answer.stopped),
            )
            if names
        ]
        if not done:  # another pass asked first: the driver runs the revision already
            return None
        log.info("%s/%s: revision %s swapped in: %s", ctx.namespace, ctx.app, answer.revision, "; ".join(done))
        took = f" in {answer.tookMs} ms" if answer.tookMs is not None else ""
        message = f"revision {answer.revision}: {'; '.join(done)}{took}; {len(answer.kept)} kept running"
        ctx.events.append(("Normal", "Swapped", message))
        return None

    def start_driver(self, ctx: RolloutContext, action: StartDriver, submit: bool = True) -> None:
        """Ensure a handover's second driver: its runner ConfigMap (standby while the rollout's phase says so)
        and (`submit`) its SparkApplication, submitted for the revision it runs."""
        if action.name == ctx.app_driver():
            return  # the app's own driver is one of its children
        spec = self.cluster.revision_spec(ctx.namespace, ctx.app, action.revision, ctx.specs)
        if spec is None:
            return
        rollout = ctx.decision.step.rollout
        standby = on_standby(rollout, action.name, ctx.recorded_driver, spec.updateStrategy.rollback.enabled)
        bootstrap = self.cluster.bootstrap(spec, ctx.namespace)
        config = ch.runner_config(
            ctx.app, ctx.namespace, spec, bootstrap, *ctx.folders(action.revision), standby=standby
        )
        pin = sparkapp.DriverPin(action.revision, action.revision)
        children = [ch.runner_configmap(ctx.app, ctx.namespace, config, action.name)]
        if submit:
            claim = ctx.obs.checkpoint_claim
            if claim is None and spec.checkpoint.volumeClaim:  # a tick: the claim is read when it matters
                claim = self.cluster.checkpoint_claim(ctx.namespace, spec.checkpoint.volumeClaim)
            together = sparkapp.pods_kept_together(spec, self.claims, claim)
            children.append(
                sparkapp.spark_application(ctx.app, ctx.namespace, spec, pin=pin, name=action.name, together=together)
            )
        for child in children:
            adopt(child, ctx.owner)
            self.cluster.apply(child)

    def set_driver_state(
        self, ctx: RolloutContext, action: Activate | Resume | Drain, observed: Observed
    ) -> Observed | None:
        """Ask the driver to run (Activate, Resume) or drain (Drain); the observation as its answer changed it."""
        rollout = ctx.decision.step.rollout
        wanted: Literal["running", "drained"] = "drained" if isinstance(action, Drain) else "running"
        if isinstance(action, Drain) and rollout is not None and action.driver == rollout.toDriver:
            # A new driver drained in a rollback: its runner config says standby before it is asked, so a restart
            # meanwhile does not start its queries beside the resumed one.
            self.start_driver(ctx, StartDriver(action.driver, rollout.toRevision, standby=True, steps=()), submit=False)
        config = None
        if isinstance(action, Resume) and action.revision is not None:
            config = self.revision_config(ctx, action.revision)
            if config is None:
                return None  # the ConfigMap of the stable revision is applied first (ApplyRevision)
        answer = self._ask_state(ctx, action.driver, wanted, config)
        if answer is None:
            return None
        started = tuple(QueryFacts(name=q, revision=answer.revision, active=True) for q in answer.started)
        changed = with_driver_state(observed, action.driver, answer.state, started)
        ctx.drivers.facts = {d.name: d for d in changed.drivers}
        return changed

    def _ask_state(
        self, ctx: RolloutContext, driver: str, wanted: Literal["running", "drained"], config: RunnerConfig | None
    ) -> StateResponse | None:
        """PUT /v1/state, unless the driver is in that state already or does not answer yet; its answer, or None.
        `config`: what a drained driver resumes on (else what it ran)."""
        facts, address = ctx.drivers.facts.get(driver), ctx.drivers.addresses.get(driver)
        needed = ("standby", "drained") if wanted == "running" else ("running", "draining")
        if facts is None or address is None or facts.state not in needed:
            return None
        token = self.cluster.control_token(ctx.namespace, ctx.app)
        if token is None:
            message = f"no control token in Secret {names.control_secret_name(ctx.app)}"
            ctx.events.append(("Warning", "HandoverFailed", message))
            return None
        try:
            answer = self.driver_client.set_state(address, token, wanted, config)
        except DriverUnavailable as exc:  # also a refusal: the rollout's deadline decides what follows
            self.cluster.forget_token(ctx.namespace, ctx.app)
            ctx.events.append(("Warning", "HandoverFailed", f"driver {driver}: {str(exc)[:1000]}"))
            return None
        what = f"stopped {', '.join(answer.stopped)}" if wanted == "drained" else f"started {', '.join(answer.started)}"
        log.info(
            "%s/%s: driver %s %s -> %s in %d ms",
            ctx.namespace,
            ctx.app,
            driver,
            answer.previous,
            answer.state,
            answer.tookMs,
        )
        reason = {"drained": "Drained", "running": "Activated" if answer.previous == "standby" else "Resumed"}[wanted]
        message = f"driver {driver} (revision {answer.revision}): {what} in {answer.tookMs} ms"
        ctx.events.append(("Normal", reason, message))
        return answer

    def delete_checkpoints(self, ctx: RolloutContext, folders: tuple[str, ...], address: str | None) -> None:
        """Once, when a checkpoint migration ends: the app's driver (at `address`) deletes the folders it left
        behind (the operator does not mount the checkpoint volume). Not deleted (no driver answering, or it
        still needs one), they stay, and the event says which."""
        listed = ", ".join(folders)
        token = self.cluster.control_token(ctx.namespace, ctx.app)
        if address is None or token is None:
            why = "no driver answers" if address is None else "no control token"
            ctx.events.append(("Warning", "CheckpointsKept", f"{why}: checkpoint folders {listed} stay"))
            return
        try:
            answer = self.driver_client.delete_checkpoints(address, token, list(folders))
        except DriverUnavailable as exc:
            ctx.events.append(("Warning", "CheckpointsKept", f"checkpoint folders {listed} stay: {str(exc)[:1000]}"))
            return
        gone = f"; already gone: {', '.join(answer.absent)}" if answer.absent else ""
        message = f"checkpoint folders no longer needed, deleted: {', '.join(answer.deleted) or 'none'}{gone}"
        ctx.events.append(("Normal", "CheckpointsDeleted", message))

    def revision_config(self, ctx: RolloutContext, revision: str) -> RunnerConfig | None:
        """What a driver runs for `revision` with its queries' checkpoints where the rollout places them; None
        when the revision's spec is gone."""
        spec = self.cluster.revision_spec(ctx.namespace, ctx.app, revision, ctx.specs)
        if spec is None:
            return None
        return ch.runner_config(
            ctx.app, ctx.namespace, spec, self.cluster.bootstrap(spec, ctx.namespace), *ctx.folders(revision)
        )

    # ------------------------------------------------------------------------ driver behind
    def restart_behind_driver(
        self,
        owner: dict[str, Any],
        driver: str,
        spark_app: dict[str, Any] | None,
        runs: str,
        claimed: str,
        specs: dict[str, StreamingAppSpec],
    ) -> tuple[str, str, str] | None:
        """The app's driver (SparkApplication `driver`) runs revision `runs` where the status claims `claimed`, and
        no rollout explains it (rollout.decide.driver_behind): its pod is deleted, and spark-operator starts it
        again on what its runner ConfigMap says (on the same checkpoints; migrated queries hand over as they
        start). Nothing is done when the two run the same pipeline (a change only outside it, adopted without a
        rollout), nor when the runner ConfigMap does not say `claimed` yet (a restart would read the same again:
        the pass that applies it comes first). Returns the event."""
        namespace, app = owner["metadata"]["namespace"], owner["metadata"]["name"]
        if not self.pipelines_differ(namespace, app, runs, claimed, specs):
            return None
        if self.cluster.runner_revision(namespace, driver) != claimed:
            log.info(
                "%s/%s: driver runs %s, its runner ConfigMap not yet %s: not restarted", namespace, app, runs, claimed
            )
            return None
        pod = (((spark_app or {}).get("status") or {}).get("driverInfo") or {}).get("podName")
        if not pod:
            return None
        self.cluster.delete("v1", "Pod", namespace, pod)
        message = (
            f"driver pod {pod} runs revision {runs}, not {claimed} (it read its config before {claimed} was "
            f"written): deleted, spark-operator starts it again on revision {claimed}"
        )
        log.warning("%s/%s: %s", namespace, app, message)
        return ("Warning", "DriverRestarted", message)

    def pipelines_differ(
        self, namespace: str, app: str, before: str, after: str, specs: dict[str, StreamingAppSpec]
    ) -> bool:
        """Whether a driver running revision `before` runs something other than `after` (a rollout would be due
        between them). Revisions are hashes of what they hold, so the answer is kept. A spec that is gone (pruned
        by an operator before this one kept the revision a driver runs) counts as the same: a healthy driver is
        not restarted for what cannot be known."""
        key = (namespace, app, before, after)
        if key not in self._pipelines_differ:
            old = self.cluster.revision_spec(namespace, app, before, specs)
            new = self.cluster.revision_spec(namespace, app, after, specs)
            if old is None or new is None:
                log.warning("%s/%s: revision %s or %s has no spec kept: not compared", namespace, app, before, after)
                return False
            differ = classify(old, new).needs_rollout
            if len(self._pipelines_differ) > 10_000:
                self._pipelines_differ.clear()
            self._pipelines_differ[key] = differ
        return self._pipelines_differ[key]
