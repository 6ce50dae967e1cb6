"""The driver's SparkApplication, rendered as a plain dict: its pods (a Spark pod template with the env,
volumes, security context and scheduling), sluice's Spark settings under the app's own, and the annotations that
say what it was rendered and submitted for (so a new rendering alone never resubmits a running driver)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sluice.api.app import (
    S3A_SCHEME,
    S3Spec,
    revision,
)
from sluice.api.contract import RUNNER_CONFIG_FILE
from sluice.api.kafka_clients import KAFKA_SECRETS_MOUNT, SPARK_REDACTED_OPTIONS, kafka_security
from sluice.api.pods import CHECKPOINT_VOLUME, CONTROL_VOLUME, KAFKA_SECRET_VOLUME_PREFIX, PIPELINE_VOLUME

from .model import StreamingAppSpec
from .names import (
    APP_LABEL,
    CONTROL_TOKEN_MOUNT,
    PIPELINE_MOUNT,
    RENDERED_ANNOTATION,
    REVISION_LABEL,
    RUNNER_FILE,
    RUNTIME_ANNOTATION,
    SPARK_APPLICATION_API,
    SPARK_CONTAINERS,
    SPARK_NETWORK_POLICY_STEP,
    SUBMITTED_EXECUTORS_ANNOTATION,
    SUBMITTED_REVISION_ANNOTATION,
    checkpoint_claim_name,
    control_secret_name,
    labels,
    runner_configmap_name,
    service_account_name,
)
from .settings import SHARED, ClaimDefaults


@dataclass(frozen=True)
class DriverPin:
    """The revisions of the app's driver: `runs`, what a starting driver runs (the runner ConfigMap);
    `submitted`, what its SparkApplication was submitted for (changing it resubmits the driver)."""

    runs: str
    submitted: str


@dataclass(frozen=True)
class ClaimFacts:
    """The app's own checkpoint claim (spec.checkpoint.volumeClaim) as the pass found it."""

    name: str
    exists: bool
    phase: str | None = None
    access_modes: tuple[str, ...] = ()
    owner_uids: tuple[str, ...] = ()  # its ownerReferences: the app's when deleted with it


def claim_facts(name: str, claim: dict[str, Any] | None) -> ClaimFacts:
    if claim is None:
        return ClaimFacts(name, exists=False)
    modes = tuple((claim.get("spec") or {}).get("accessModes") or ())
    owners = tuple(owner["uid"] for owner in (claim.get("metadata") or {}).get("ownerReferences") or [])
    return ClaimFacts(name, True, (claim.get("status") or {}).get("phase"), modes, owners)


def pods_kept_together(spec: StreamingAppSpec, claims: ClaimDefaults, claim: ClaimFacts | None) -> bool:
    """Every pod of the app runs on the driver's node when its checkpoint is on a claim not every node may mount
    (ReadWriteOnce: one node mounts it, for any number of its pods). An app's own claim not seen yet counts as one."""
    if spec.checkpoint.is_hadoop_uri():  # no claim
        return False
    modes = (claim.access_modes if claim else ()) if spec.checkpoint.volumeClaim else (claims.access_mode,)
    return SHARED not in modes


def _with_pods_together(app: str, affinity: dict[str, Any] | None) -> dict[str, Any]:
    """The app's own affinity, and a required one to the node of the app's pods (the first pod, the driver,
    matches itself, so it schedules anywhere)."""
    together = {"labelSelector": {"matchLabels": {APP_LABEL: app}}, "topologyKey": "kubernetes.io/hostname"}
    affinity = dict(affinity or {})
    pod_affinity = dict(affinity.get("podAffinity") or {})
    required = list(pod_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or [])
    pod_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = [*required, together]
    return {**affinity, "podAffinity": pod_affinity}


# s3a's credential providers (fs.s3a.aws.credentials.provider): a key pair from the pod's environment (the
# Secret), else the AWS SDK's default chain: web identity (IRSA), EKS Pod Identity, an instance profile.
S3A_KEY_PAIR_PROVIDER = "software.amazon.awssdk.auth.credentials.EnvironmentVariableCredentialsProvider"
S3A_POD_IDENTITY_PROVIDER = "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider"


def s3a_conf(spec: StreamingAppSpec) -> dict[str, str]:
    """Hadoop's S3A settings for an s3a:// checkpoint (spec.checkpoint.s3)."""
    if not spec.checkpoint.location_or_claim_path.startswith(S3A_SCHEME):
        return {}
    s3 = spec.checkpoint.s3 or S3Spec()
    conf = {
        "spark.hadoop.fs.s3a.aws.credentials.provider": (
            S3A_KEY_PAIR_PROVIDER if s3.credentialsSecret else S3A_POD_IDENTITY_PROVIDER
        ),
        "spark.hadoop.fs.s3a.path.style.access": str(s3.pathStyleAccess).lower(),
    }
    if s3.endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = s3.endpoint
    if s3.region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = s3.region
    return conf


def s3_credentials_env(spec: StreamingAppSpec) -> list[dict[str, Any]]:
    """The key pair spec.checkpoint.s3 names, as the AWS SDK's variables from the Secret (never copied)."""
    secret = spec.checkpoint.s3.credentialsSecret if spec.checkpoint.s3 else None
    if secret is None:
        return []
    return [
        {"name": name, "valueFrom": {"secretKeyRef": {"name": secret.secretName, "key": key}}}
        for name, key in (("AWS_ACCESS_KEY_ID", secret.accessKeyId), ("AWS_SECRET_ACCESS_KEY", secret.secretAccessKey))
    ]


def _pod_spec(app: str, spec: StreamingAppSpec, role: str, driver: str, together: bool) -> dict[str, Any]:
    resources = spec.spark.driver if role == "driver" else spec.spark.executor
    pod = spec.spark.pod
    out: dict[str, Any] = {
        "cores": resources.cores,
        "memory": resources.memory,
        "labels": {**pod.labels, **labels(app, role)},
        "serviceAccount": service_account_name(app, spec),
    }
    for key in ("coreLimit", "memoryOverhead"):
        if getattr(resources, key):
            out[key] = getattr(resources, key)
    if pod.annotations:
        out["annotations"] = dict(pod.annotations)
    if pod.nodeSelector:
        out["nodeSelector"] = dict(pod.nodeSelector)
    out["template"] = _pod_template(app, spec, role, driver, together)
    return out


# What Pod Security "restricted" asks of every container (with a non-root user and the runtime's seccomp
# profile on the pod), so Spark's pods run in namespaces that enforce it.
CONTAINER_SECURITY = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
# Where Spark's container writes, given a read-only root filesystem: the JVM's and Python's temporary files,
# and the working directory (spark-submit's and the executors' fetched files). Spark adds its local dirs itself.
SCRATCH_VOLUMES = {"sluice-tmp": "/tmp", "sluice-work-dir": "/opt/spark/work-dir"}


def _pod_template(app: str, spec: StreamingAppSpec, role: str, driver: str, together: bool) -> dict[str, Any]:
    """Env, volumes and the security context as a Spark pod template: Spark applies it itself, so apps need
    no spark-operator webhook (which is what applies SparkApplication's env/configMaps/volumes fields).
    `driver`: the SparkApplication, whose runner ConfigMap its driver mounts. `together`: pods_kept_together."""
    container: dict[str, Any] = {"name": SPARK_CONTAINERS[role]}
    volumes: list[dict[str, Any]] = []
    mounts: list[dict[str, Any]] = []
    pod = spec.spark.pod
    env = [*({"name": k, "value": v} for k, v in sorted(pod.env.items())), *s3_credentials_env(spec)]
    if env:
        container["env"] = env
    if pod.envFrom:
        container["envFrom"] = [source.model_dump(exclude_none=True) for source in pod.envFrom]
    claim = checkpoint_claim_name(app, spec)
    if claim:
        volumes.append({"name": CHECKPOINT_VOLUME, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": spec.checkpoint.location_or_claim_path})
    if role == "driver":
        volumes.append({"name": PIPELINE_VOLUME, "configMap": {"name": runner_configmap_name(driver)}})
        mounts.append({"name": PIPELINE_VOLUME, "mountPath": PIPELINE_MOUNT, "readOnly": True})
        volumes.append({"name": CONTROL_VOLUME, "secret": {"secretName": control_secret_name(app)}})
        mounts.append({"name": CONTROL_VOLUME, "mountPath": CONTROL_TOKEN_MOUNT, "readOnly": True})
        for volume, mount in kafka_secret_volumes(spec):
            volumes.append(volume)
            mounts.append(mount)
    if pod.readOnlyRootFilesystem:
        for name, path in SCRATCH_VOLUMES.items():
            volumes.append({"name": name, "emptyDir": {}})
            mounts.append({"name": name, "mountPath": path})
    volumes += [volume.model_dump() for volume in pod.volumes]
    mounts += [mount.model_dump(exclude_defaults=True) for mount in pod.volumeMounts]
    if mounts:
        container["volumeMounts"] = mounts
    container["securityContext"] = {**CONTAINER_SECURITY, "readOnlyRootFilesystem": pod.readOnlyRootFilesystem}
    security = {
        "runAsNonRoot": True,
        "runAsUser": pod.runAsUser,
        "runAsGroup": pod.runAsUser,
        "fsGroup": pod.fsGroup,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    scheduling = {
        "tolerations": [toleration.model_dump(exclude_none=True) for toleration in pod.tolerations],
        "affinity": _with_pods_together(app, pod.affinity) if together else pod.affinity,
        "topologySpreadConstraints": pod.topologySpreadConstraints,
        "priorityClassName": pod.priorityClassName,
        "imagePullSecrets": [{"name": name} for name in pod.imagePullSecrets],
        "volumes": volumes,
    }
    return {
        "spec": {
            "securityContext": security,
            "containers": [container],
            **{key: value for key, value in scheduling.items() if value},
        }
    }


def kafka_secret_volumes(spec: StreamingAppSpec) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """The driver's volume and mount of each Secret spec.kafka names (only the keys it names), where
    kafka_security's files are. Executors get the login inline from the driver (KafkaClient)."""
    keys: dict[str, set[str]] = {}
    for source in kafka_security(spec.kafka)[1].values():
        keys.setdefault(source.secret, set()).add(source.key)
    return [
        (
            {
                "name": f"{KAFKA_SECRET_VOLUME_PREFIX}{index}",
                "secret": {"secretName": secret, "items": [{"key": key, "path": key} for key in sorted(keys[secret])]},
            },
            {
                "name": f"{KAFKA_SECRET_VOLUME_PREFIX}{index}",
                "mountPath": f"{KAFKA_SECRETS_MOUNT}/{secret}",
                "readOnly": True,
            },
        )
        for index, secret in enumerate(sorted(keys))
    ]


def pipeline_configmap_of(spark_app: dict[str, Any]) -> str:
    """The name of the ConfigMap a SparkApplication's driver mounts (the app's runner ConfigMap)."""
    volumes = spark_app["spec"]["driver"]["template"]["spec"]["volumes"]
    return next(v["configMap"]["name"] for v in volumes if v["name"] == PIPELINE_VOLUME)


# Per pod, above Spark's 384m: see spark_conf. The driver's: its JVM's non-heap (make soak, Native Memory Tracking,
# 512m heap at its limit after 27 min: metaspace 203 MB, code cache 148 MB and growing towards its 240 MiB, thread
# stacks 70 MB, symbols 49 MB, classes 33 MB, other ~55 MB) beside the Python runner (180 MB): with 768m the pod's
# anonymous memory reached 1,271 of its 1,342 MB after 39 minutes, still growing.
DRIVER_MIN_MEMORY_OVERHEAD = "1g"
UI_RETAINED = "100"  # jobs, stages and SQL executions the driver's UI keeps (Spark's default: 1,000 each)


EXECUTOR_MIN_MEMORY_OVERHEAD = "768m"


def spark_conf(spec: StreamingAppSpec) -> dict[str, str]:
    """sluice's defaults under the app's own sparkConf. Shuffle (state) partitions are fixed at an app's
    first batch, so they default to the scaling ceiling: every executor the app may get has tasks to run."""
    ceiling = max(spec.executors.max * spec.spark.executor.cores, 1)
    defaults = {
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.sql.shuffle.partitions": str(ceiling),
        # Executors change through the control API (live), never through Spark's own policy.
        "spark.dynamicAllocation.enabled": "false",
        # The driver pod holds the Python runner beside the JVM, whose threads, metaspace and code cache grow
        # past Spark's 384m minimum within minutes on a small driver (the kernel kills it at the pod's limit).
        "spark.driver.minMemoryOverhead": DRIVER_MIN_MEMORY_OVERHEAD,
        # An executor pod holds Python workers beside the JVM (the exactly-once sink's Arrow writers and their
        # Kafka producers, ~150 MB each): a 512m executor went past 896 MiB within minutes of queries restarting.
        "spark.executor.minMemoryOverhead": EXECUTOR_MIN_MEMORY_OVERHEAD,
        # Spark 4.2 creates an executor NetworkPolicy at submission, which needs RBAC spark-operator
        # does not hold; the operator makes the same policy itself (network_policies).
        "spark.kubernetes.driver.pod.excludedFeatureSteps": SPARK_NETWORK_POLICY_STEP,
        # The Kafka login goes to Spark's source and sink as options (KafkaClient.spark_options): kept out of plans.
        "spark.sql.redaction.options.regex": SPARK_REDACTED_OPTIONS,
        # The UI keeps 1,000 jobs, stages and SQL executions by default, in the driver's heap: a micro-batch is one
        # or more of each, so a streaming driver fills them within its first hour (make soak: the word count's held
        # 922 jobs, 935 stages and 1,000 executions, plans and metrics included, at 37 minutes) and carries them
        # from then on. The last 100 are the last minutes of batches.
        "spark.ui.retainedJobs": UI_RETAINED,
        "spark.ui.retainedStages": UI_RETAINED,
        "spark.sql.ui.retainedExecutions": UI_RETAINED,
        **s3a_conf(spec),
    }
    return {**defaults, **spec.spark.sparkConf}


def spark_application(
    app: str,
    namespace: str,
    spec: StreamingAppSpec,
    submitted_executors: int | None = None,
    pin: DriverPin | None = None,
    name: str | None = None,
    together: bool = False,
) -> dict[str, Any]:
    """`submitted_executors`: the count the running SparkApplication was submitted with. spark-operator
    resubmits on any spec change, so the count is never edited to scale; the live count goes through the
    driver's control API instead. `pin`: the revisions it runs and was submitted for (default: the spec's).
    `name`: the SparkApplication's (default: the app's; a fenced handover's new driver has its own).
    `together`: its pods on one node (pods_kept_together)."""
    rev = revision(spec)
    pin = pin or DriverPin(rev, rev)
    name = name or app
    driver = _pod_spec(app, spec, "driver", name, together)
    driver["annotations"] = {**driver.get("annotations", {}), SUBMITTED_REVISION_ANNOTATION: pin.submitted}
    instances = spec.executors.instances if submitted_executors is None else submitted_executors
    executor = {**_pod_spec(app, spec, "executor", name, together), "instances": instances}
    executor.pop("serviceAccount")
    body: dict[str, Any] = {
        "apiVersion": SPARK_APPLICATION_API,
        "kind": "SparkApplication",
        "metadata": {
            "name": name,
            "namespace": namespace,
            # The revision it was submitted for, which changes only with its spec (a resubmission): a write of
            # its metadata alone while spark-operator resubmits it can lose that submission (observer.lost_submission).
            "labels": {**labels(app, "driver"), REVISION_LABEL: pin.submitted},
            "annotations": {SUBMITTED_EXECUTORS_ANNOTATION: str(instances)},
        },
        "spec": {
            "type": "Python",
            "pythonVersion": "3",
            "mode": "cluster",
            "image": spec.spark.image,
            "imagePullPolicy": spec.spark.imagePullPolicy,
            "sparkVersion": spec.spark.version,
            "mainApplicationFile": RUNNER_FILE,
            "arguments": [f"{PIPELINE_MOUNT}/{RUNNER_CONFIG_FILE}"],
            "sparkConf": spark_conf(spec),
            # A streaming driver should always come back, with back-off between attempts.
            "restartPolicy": {"type": "Always", "onFailureRetryInterval": 10, "onSubmissionFailureRetryInterval": 20},
            "driver": driver,
            "executor": executor,
        },
    }
    body["metadata"]["annotations"] |= {RENDERED_ANNOTATION: _digest(body["spec"]), RUNTIME_ANNOTATION: runtime(spec)}
    return body


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def runtime(spec: StreamingAppSpec) -> str:
    """A hash of what the app's SparkApplication is rendered from and only a new driver applies: its Spark
    settings, its Kafka login, its checkpoint. Fields left at their defaults are not hashed, so a release that
    adds a defaulted field does not change it."""

    def written(model: Any) -> Any:
        return model.model_dump(mode="json", by_alias=True, exclude_defaults=True) if model is not None else None

    kafka = {"tls": written(spec.kafka.tls), "authentication": written(spec.kafka.authentication)}
    return _digest({"spark": written(spec.spark), "kafka": kafka, "checkpoint": written(spec.checkpoint)})


def submitted_revision(spark_app: Mapping[str, Any] | None) -> str | None:
    """The revision a SparkApplication was submitted for (None: none, or one made before rollouts)."""
    if spark_app is None:
        return None
    annotations = ((spark_app.get("spec") or {}).get("driver") or {}).get("annotations") or {}
    return annotations.get(SUBMITTED_REVISION_ANNOTATION)


def kept_as_submitted(current: Mapping[str, Any] | None, desired: Mapping[str, Any]) -> bool:
    """Whether the driver's SparkApplication stays as it is though this operator renders it otherwise: it was
    submitted for the revision and the runtime it should be (a release before the runtime hash: for the revision),
    by another operator release or under other settings. spark-operator restarts the driver on any change of the
    spec, and a new rendering is no reason to restart an app: it applies when the app next needs a new driver.
    A change of the app's runtime (resources, sparkConf, …) is one: applied, as spark-operator's resubmission.
    A SparkApplication this operator rendered is applied as usual, so an edit by hand is undone."""
    if current is None or submitted_revision(current) != submitted_revision(desired):
        return False
    annotations, wanted = current.get("metadata", {}).get("annotations") or {}, desired["metadata"]["annotations"]
    if annotations.get(RENDERED_ANNOTATION) == wanted[RENDERED_ANNOTATION]:
        return False
    return annotations.get(RUNTIME_ANNOTATION) in (None, wanted[RUNTIME_ANNOTATION])
