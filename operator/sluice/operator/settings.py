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


@dataclass(frozen=True)
class Settings:
    resync_seconds: float = 300.0
    tick_seconds: float = 5.0
    status_figures_seconds: float = 30.0  # a running app's lag, inputRate and observedAt: written at most this often
    workers: int = 8
    checkpoints: ClaimDefaults = field(default_factory=ClaimDefaults)
    guard_rails: GuardRails = field(default_factory=GuardRails)

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
        )


SETTINGS = Settings.from_env()
