"""The image and Spark version of an app that names none come from the operator's settings as of its first run,
and stay: an operator release with another default image restarts no app."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sluice.operator import children as ch
from sluice.operator import names
from sluice.operator import spark_application as sparkapp
from sluice.operator.desired import kept_defaults, parse_spec, with_operator_defaults
from sluice.operator.guard_rails import GuardRails, guard_rail_problems
from sluice.operator.settings import CheckpointStore, Settings, SparkDefaults

EXAMPLE = Path(__file__).resolve().parents[2] / "pipelines" / "examples" / "wordcount.yaml"
RELEASE_1 = Settings(spark=SparkDefaults("registry/spark:1.0", "4.2.0"))
RELEASE_2 = Settings(spark=SparkDefaults("registry/spark:2.0", "4.3.0"))


@pytest.fixture
def raw_spec() -> dict:
    spec = yaml.safe_load(EXAMPLE.read_text())["spec"]
    spec.get("spark", {}).pop("image", None)
    spec.get("spark", {}).pop("version", None)
    return spec


def spark_application(spec) -> dict:
    return sparkapp.spark_application("wc", "apps", spec)


def test_the_settings_name_this_releases_image_unless_the_chart_names_one() -> None:
    from importlib.metadata import version

    assert SparkDefaults().image == f"sluice/spark:{version('sluice')}"
    env = {"SLUICE_SPARK_IMAGE": "registry/spark:9", "SLUICE_SPARK_VERSION": "4.3.0"}
    assert Settings.from_env(env).spark == SparkDefaults("registry/spark:9", "4.3.0")


def test_an_app_naming_no_image_runs_the_operators_and_keeps_it(raw_spec) -> None:
    first = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_1, {})
    spark = spark_application(first)["spec"]
    assert (spark["image"], spark["sparkVersion"]) == ("registry/spark:1.0", "4.2.0")
    kept = kept_defaults(first)
    assert (kept["sparkImage"], kept["sparkVersion"]) == ("registry/spark:1.0", "4.2.0")
    # A later operator release with another default: the app runs what it ran, the same revision.
    after_upgrade = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, kept)
    assert (after_upgrade.spark.image, after_upgrade.spark.version) == ("registry/spark:1.0", "4.2.0")
    assert ch.revision(after_upgrade) == ch.revision(first)
    # A new app gets the new default.
    new_app = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, {})
    assert (new_app.spark.image, new_app.spark.version) == ("registry/spark:2.0", "4.3.0")


def test_an_image_the_app_names_wins_with_its_version_or_the_operators(raw_spec) -> None:
    raw_spec.setdefault("spark", {})["image"] = "team/spark:7"
    kept = {"sparkImage": "registry/spark:1.0", "sparkVersion": "4.1.0"}
    named = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, kept)
    assert (named.spark.image, named.spark.version) == ("team/spark:7", "4.3.0")
    raw_spec["spark"]["version"] = "4.2.1"
    named = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, kept)
    assert (named.spark.image, named.spark.version) == ("team/spark:7", "4.2.1")
    del raw_spec["spark"]["image"]  # a version of its own with the kept image
    versioned = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, kept)
    assert (versioned.spark.image, versioned.spark.version) == ("registry/spark:1.0", "4.2.1")


def test_an_app_stored_with_the_old_crd_default_keeps_its_revision(raw_spec) -> None:
    """Before, spec.spark.image defaulted to sluice/spark:0.1.0 in the CRD: stored apps have it written."""
    raw_spec.setdefault("spark", {})["image"] = "sluice/spark:0.1.0"
    raw_spec["spark"]["version"] = "4.2.0"
    raw_spec["checkpoint"] = {"location": "/checkpoints"}  # the old CRD's default location, also written
    stored = parse_spec(raw_spec)
    runs = with_operator_defaults(stored, "apps", RELEASE_2, {})
    assert runs == stored and ch.revision(runs) == ch.revision(stored)
    raw_spec["checkpoint"] = {}
    assert ch.revision(with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, {})) == ch.revision(stored)


def test_the_image_guard_rail_checks_images_apps_name(raw_spec) -> None:
    rails = GuardRails(allowed_images=("registry/",))
    assert guard_rail_problems(parse_spec(raw_spec), rails) == [], "the operator's default: the administrator's"
    raw_spec.setdefault("spark", {})["image"] = "elsewhere/spark:1"
    (problem,) = guard_rail_problems(parse_spec(raw_spec), rails)
    assert problem.path == "spec.spark.image"


def test_an_app_run_before_the_status_kept_its_location_stays_on_its_claim(raw_spec) -> None:
    """A release before status.checkpointLocation ran the app on its claim; a store set since moves it not."""
    raw_spec.pop("checkpoint", None)  # the old CRD defaulted location only inside a given checkpoint object
    store = Settings(spark=RELEASE_2.spark, checkpoint_store=CheckpointStore("s3a://bucket/{namespace}"))
    old_status = {"revision": "4f4d32a248", "phase": "Running"}
    runs = with_operator_defaults(parse_spec(raw_spec), "apps", store, old_status)
    assert runs.checkpoint.location == "/checkpoints" and runs.checkpoint.s3 is None
    before = with_operator_defaults(parse_spec(raw_spec), "apps", RELEASE_2, old_status)  # no store, as then
    assert ch.revision(runs) == ch.revision(before)
    new_app = with_operator_defaults(parse_spec(raw_spec), "apps", store, {})
    assert new_app.checkpoint.location == "s3a://bucket/apps"
    ours = {**old_status, "conditions": [{"type": "CheckpointReady", "status": "True", "reason": "ObjectStore"}]}
    pruned = with_operator_defaults(parse_spec(raw_spec), "apps", store, ours)  # its location pruned away
    assert pruned.checkpoint.location == "s3a://bucket/apps", "an app of this release is not moved to the claim"


def test_a_spark_application_is_kept_only_when_rendered_otherwise_for_the_same_submission(raw_spec) -> None:
    spec = parse_spec(raw_spec)
    ours = spark_application(spec)
    assert not sparkapp.kept_as_submitted(None, ours)
    assert not sparkapp.kept_as_submitted(ours, ours)
    edited = {**ours, "spec": {**ours["spec"], "image": "by/hand:1"}}  # our rendering hash, edited since
    assert not sparkapp.kept_as_submitted(edited, ours)
    earlier = {**ours, "metadata": {**ours["metadata"], "annotations": {}}}  # a release before the hash
    assert sparkapp.kept_as_submitted(earlier, ours)
    other = {**ours, "metadata": {**ours["metadata"], "annotations": {**ours["metadata"]["annotations"]}}}
    other["metadata"]["annotations"][names.RENDERED_ANNOTATION] = "other"  # the same runtime, rendered otherwise
    assert sparkapp.kept_as_submitted(other, ours)
    raw_spec.setdefault("spark", {})["sparkConf"] = {"spark.sql.shuffle.partitions": "7"}
    tuned = spark_application(parse_spec(raw_spec))  # the same revision, another runtime: resubmitted
    assert sparkapp.submitted_revision(tuned) == sparkapp.submitted_revision(ours) and not sparkapp.kept_as_submitted(
        other, tuned
    )
    assert sparkapp.kept_as_submitted(earlier, tuned), "a release before the runtime hash: kept until it is stamped"
    raw_spec["pipeline"]["nodes"][2]["filter"] = "length(word) > 3"
    restarted = spark_application(parse_spec(raw_spec))  # submitted for another revision: a restart
    assert not sparkapp.kept_as_submitted(other, restarted)
