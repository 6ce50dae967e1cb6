"""The reconciler's verification after a driver starts (#31, the lost update), with fakes at its I/O seam (the
API server and the driver's control API): a change applied while the driver starts completes at once, the
driver that was starting comes up on the revision before, and the next pass restarts it onto the claimed one.
The same on real pods: e2e step change_while_driver_starts."""

from __future__ import annotations

from fakes import (
    APP,
    NAMESPACE,
    POD,
    app_manifest,
    driver_pod_started,
    reconcile,
    runner_revision,
)

from sluice.api.contract import RUNNER_CONFIG_FILE, RunnerConfig, revision_configmap_name
from sluice.operator import children as ch
from sluice.operator import names
from sluice.operator.desired import parse_spec
from sluice.operator.reconciler import Reconciler


def test_a_change_applied_while_the_driver_starts_reaches_it(world) -> None:
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    assert runner_revision(kube) == first
    driver_pod_started(kube)  # up, but its runner not answering yet: it read the runner config of `first`

    changed = app_manifest("word != '' AND word != 'zeta'") | {"status": app["status"]}
    app = reconcile(reconciler, changed, clock=1005.0)
    claimed = app["status"]["stableRevision"]
    assert claimed != first and runner_revision(kube) == claimed
    assert (app["status"]["rollout"]["strategy"], app["status"]["rollout"]["phase"]) == ("restart", "Complete")
    assert "a driver is starting" in app["status"]["rollout"]["message"]
    assert ("Pod", POD) not in kube.deleted

    driver.revision = first  # it came up on what it had read
    app = reconcile(reconciler, app, clock=1010.0)
    assert ("Pod", POD) in kube.deleted, "the driver behind the claimed revision is restarted"
    restarted = [message for _, reason, message in app["events"] if reason == "DriverRestarted"]
    assert restarted and first in restarted[0] and claimed in restarted[0], app["events"]
    assert app["status"]["stableRevision"] == claimed and runner_revision(kube) == claimed

    driver_pod_started(kube)  # spark-operator's new pod reads the runner config: the claimed revision
    driver.revision = claimed
    kube.deleted.clear()
    app = reconcile(reconciler, app, clock=1015.0)
    assert kube.deleted == [] and app["status"]["stableRevision"] == claimed


def test_a_driver_on_a_revision_with_the_same_pipeline_is_left_alone(world) -> None:
    """A revision adopted without a rollout (nothing the driver runs changed) is not a reason to restart."""
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    driver_pod_started(kube)
    driver.revision = first
    bigger = app_manifest("word != ''")
    bigger["spec"]["checkpoint"]["size"] = "2Gi"  # a new revision, nothing the driver runs
    app = reconcile(reconciler, bigger | {"status": app["status"]}, clock=1005.0)
    stable = app["status"]["stableRevision"]
    assert stable != first and runner_revision(kube) == stable, "adopted without a rollout"
    app = reconcile(reconciler, app, clock=1010.0)
    assert ("Pod", POD) not in kube.deleted, (first, stable, app["events"])


def started_on_the_revision_before(world) -> tuple[dict, str, str]:
    """The lost update's state: the change completed at once, the driver up on the revision before."""
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    driver_pod_started(kube)
    app = reconcile(reconciler, app_manifest("word != '' AND word != 'zeta'") | {"status": app["status"]}, 1005.0)
    driver.revision = first
    return app, first, app["status"]["stableRevision"]


def test_no_restart_while_the_runner_config_does_not_say_the_claimed_revision(world) -> None:
    """A restarted driver reads its runner ConfigMap: while that does not hold the claimed revision (its apply
    failed, say), a restart would bring the same revision back, again and again. The next full pass applies it;
    then the driver is restarted."""
    reconciler, kube, _ = world
    app, first, claimed = started_on_the_revision_before(world)
    runner = kube.objects[("ConfigMap", NAMESPACE, names.runner_configmap_name(APP))]
    config = RunnerConfig.model_validate_json(runner["data"][RUNNER_CONFIG_FILE])
    runner["data"][RUNNER_CONFIG_FILE] = config.model_copy(update={"revision": first}).model_dump_json()
    outcome = reconciler.reconcile(app, full=False, clock=1010.0)  # a tick applies nothing
    assert ("Pod", POD) not in kube.deleted, outcome.events
    assert runner_revision(kube) == first != claimed
    reconciler.reconcile(app, clock=1015.0)  # a full pass applies the runner ConfigMap (the driver not asked yet)
    assert runner_revision(kube) == claimed
    outcome = reconciler.reconcile(app, full=False, clock=1020.0)
    assert ("Pod", POD) in kube.deleted, outcome.events


def test_a_driver_on_a_revision_whose_spec_is_gone_is_left_alone(world) -> None:
    """An operator before this one pruned the ConfigMap of a revision a driver still ran (one adopted without a
    rollout): what it runs cannot be compared, and a healthy driver is not restarted for it."""
    _, kube, driver = world
    app, first, _ = started_on_the_revision_before(world)
    kube.delete("v1", "ConfigMap", NAMESPACE, revision_configmap_name(APP, first))
    fresh = Reconciler(kube=kube, driver_client=driver)  # type: ignore[arg-type]  # nothing cached
    outcome = fresh.reconcile(app, full=False, clock=1010.0)
    assert ("Pod", POD) not in kube.deleted, outcome.events


def test_a_driver_ahead_of_a_lost_rollout_record_is_not_restarted(world) -> None:
    """The operator swapped the new revision in and was killed before it wrote the rollout: its successor finds
    the driver on the spec's revision, ahead of the status, plans the rollout again and finds it done there."""
    reconciler, kube, driver = world
    app = reconcile(reconciler, app_manifest("word != ''"), clock=1000.0)
    first = app["status"]["stableRevision"]
    driver_pod_started(kube)
    changed = app_manifest("word != '' AND word != 'zeta'") | {"status": app["status"]}
    driver.revision = ch.revision(parse_spec(changed["spec"]))  # type: ignore[arg-type]
    app = reconcile(reconciler, changed, clock=1005.0)
    assert ("Pod", POD) not in kube.deleted, app["events"]
    rollout = app["status"]["rollout"]
    assert (rollout["fromRevision"], rollout["strategy"]) == (first, "hotSwap") and driver.revision != first
