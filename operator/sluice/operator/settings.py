"""The operator's own settings, resolved from its environment in one place (the chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from importlib.metadata import version as installed_version

from sluice.api.app import S3A_SCHEME, SPARK_VERSION, CheckpointSpec, S3CredentialsSecret, S3Spec

from .guard_rails import GuardRails

SHARED = "ReadWriteMany"  # a claim every node may mount
ONE_POD = "ReadWriteOncePod"  # a claim no executor could mount beside the driver


@dataclass(frozen=True)
class ClaimDefaults:
    """The checkpoint claim the operator creates for an app that names none."""

    create: bool = True
    size: str = "1Gi"
    storage_class: str | None = None  # None: the cluster's default class
    access_mode: str = "ReadWriteOnce"


@dataclass(frozen=True)
class CheckpointStore:
    """Where an app that names no checkpoint location keeps it (the chart's checkpoints.location): a Hadoop URI
    with `{namespace}` in it, each app under <it>/<app>; None: a claim the operator creates."""

    location: str | None = None
    s3: S3Spec | None = None  # how pods reach an s3a:// store

    def location_for(self, namespace: str) -> str | None:
        return self.location.replace("{namespace}", namespace) if self.location else None

    @classmethod
    def from_env(cls, env: dict[str, str]) -> CheckpointStore:
        """The chart's checkpoints.location and checkpoints.s3.* (a bad value stops the operator at start, named)."""
        location = env.get("SLUICE_CHECKPOINT_LOCATION") or None
        if location is None:
            return cls()
        if not CheckpointSpec(location=location.replace("{namespace}", "x")).is_hadoop_uri():
            raise ValueError(f"SLUICE_CHECKPOINT_LOCATION (checkpoints.location): not a Hadoop URI: {location!r}")
        if not location.startswith(S3A_SCHEME):
            return cls(location)
        secret = env.get("SLUICE_CHECKPOINT_S3_CREDENTIALS_SECRET") or None
        s3 = S3Spec(
            endpoint=env.get("SLUICE_CHECKPOINT_S3_ENDPOINT") or None,
            region=env.get("SLUICE_CHECKPOINT_S3_REGION") or None,
            pathStyleAccess=env.get("SLUICE_CHECKPOINT_S3_PATH_STYLE_ACCESS", "false").lower() == "true",
            credentialsSecret=S3CredentialsSecret(secretName=secret) if secret else None,
        )
        return cls(location, s3)


@dataclass(frozen=True)
class SparkDefaults:
    """The image and Spark version of apps that name none (the chart's sparkImage and sparkVersion): this
    release's Spark image by default."""

    image: str = field(default_factory=lambda: f"sluice/spark:{installed_version('sluice')}")
    version: str = SPARK_VERSION

    @classmethod
    def from_env(cls, env: dict[str, str]) -> SparkDefaults:
        default = cls()
        image = env.get("SLUICE_SPARK_IMAGE") or default.image
        return cls(image, env.get("SLUICE_SPARK_VERSION") or default.version)


DENIED_NAMESPACES = ("kube-system", "kube-public", "kube-node-lease")


@dataclass(frozen=True)
class Access:
    """The RBAC the operator works with (the chart's rbac.yaml): the ClusterRoles it binds but does not hold."""

    driver_cluster_role: str = "sluice-spark-driver"  # bound to each app's driver account
    app_namespace_cluster_role: str | None = None  # bound to itself where it handles an app (None: the chart did)
    service_account: tuple[str, str] | None = None  # its own (namespace, name)
    denied_namespaces: tuple[str, ...] = DENIED_NAMESPACES  # apps there are refused

    @classmethod
    def from_env(cls, env: dict[str, str]) -> Access:
        namespace, _, name = env.get("SLUICE_SERVICE_ACCOUNT", "").partition("/")
        denied = env.get("SLUICE_DENIED_NAMESPACES")
        return cls(
            driver_cluster_role=env.get("SLUICE_DRIVER_CLUSTER_ROLE") or cls.driver_cluster_role,
            app_namespace_cluster_role=env.get("SLUICE_APP_NAMESPACE_CLUSTER_ROLE") or None,
            service_account=(namespace, name) if namespace and name else None,
            denied_namespaces=DENIED_NAMESPACES if denied is None else tuple(n for n in denied.split(",") if n),
        )


@dataclass(frozen=True)
class Settings:
    resync_seconds: float = 300.0
    tick_seconds: float = 5.0
    status_figures_seconds: float = 30.0  # a running app's lag, inputRate and observedAt: written at most this often
    workers: int = 8
    upgrade_crd: bool = True  # bring the served StreamingApp CRD up to this operator's at start (chart crds.upgrade)
    checkpoints: ClaimDefaults = field(default_factory=ClaimDefaults)
    checkpoint_store: CheckpointStore = field(default_factory=CheckpointStore)
    spark: SparkDefaults = field(default_factory=SparkDefaults)
    guard_rails: GuardRails = field(default_factory=GuardRails)
    access: Access = field(default_factory=Access)

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Settings:
        env = dict(os.environ if env is None else env)
        return cls(
            resync_seconds=float(env.get("SLUICE_RESYNC_SECONDS", "300")),
            tick_seconds=float(env.get("SLUICE_TICK_SECONDS", "5")),
            status_figures_seconds=float(env.get("SLUICE_STATUS_FIGURES_SECONDS", "30")),
            workers=int(env.get("SLUICE_WORKERS", "8")),
            upgrade_crd=env.get("SLUICE_UPGRADE_CRD", "true").lower() != "false",
            checkpoints=ClaimDefaults(
                create=env.get("SLUICE_CHECKPOINT_CLAIMS", "true").lower() != "false",
                size=env.get("SLUICE_CHECKPOINT_CLAIM_SIZE", "1Gi"),
                storage_class=env.get("SLUICE_CHECKPOINT_STORAGE_CLASS") or None,
                access_mode=env.get("SLUICE_CHECKPOINT_ACCESS_MODE", "ReadWriteOnce"),
            ),
            checkpoint_store=CheckpointStore.from_env(env),
            spark=SparkDefaults.from_env(env),
            guard_rails=GuardRails.from_env(env),
            access=Access.from_env(env),
        )


SETTINGS = Settings.from_env()
