"""The operator's own settings, resolved from its environment in one place (the chart sets them)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from .guard_rails import GuardRails


@dataclass(frozen=True)
class ClaimDefaults:
    """The checkpoint claim the operator creates for an app that names none."""

    create: bool = True
    size: str = "1Gi"
    storage_class: str | None = None  # None: the cluster's default class
    access_mode: str = "ReadWriteOnce"


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
    checkpoints: ClaimDefaults = field(default_factory=ClaimDefaults)
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
            checkpoints=ClaimDefaults(
                create=env.get("SLUICE_CHECKPOINT_CLAIMS", "true").lower() != "false",
                size=env.get("SLUICE_CHECKPOINT_CLAIM_SIZE", "1Gi"),
                storage_class=env.get("SLUICE_CHECKPOINT_STORAGE_CLASS") or None,
                access_mode=env.get("SLUICE_CHECKPOINT_ACCESS_MODE", "ReadWriteOnce"),
            ),
            guard_rails=GuardRails.from_env(env),
            access=Access.from_env(env),
        )


SETTINGS = Settings.from_env()
