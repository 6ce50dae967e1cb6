"""The settings of Spark's pods a StreamingApp may give (spec.spark.pod): placement, volumes, environment,
security, as Kubernetes' own fields, limited to what Pod Security "restricted" admits."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from .spec_types import DNS_LABEL, ObjectName, Strict, cel

VolumeName = Annotated[str, DNS_LABEL, Field(description="A volume's name (DNS label).")]
# The pods' own volumes (sluice's, which the operator mounts, and Spark's): an app's volumes take other names.
CHECKPOINT_VOLUME, PIPELINE_VOLUME, CONTROL_VOLUME = "checkpoints", "pipeline", "control"
RESERVED_VOLUMES = (CHECKPOINT_VOLUME, PIPELINE_VOLUME, CONTROL_VOLUME)
KAFKA_SECRET_VOLUME_PREFIX = "sluice-kafka-"  # the driver's mounts of spec.kafka's Secrets
RESERVED_VOLUME_PREFIXES = ("spark-", "sluice-")
# The volume sources Pod Security "restricted" admits: no hostPath, no other node or network storage drivers.
VOLUME_SOURCES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
)


class Toleration(Strict):
    """Kubernetes' Toleration: the pods may run on nodes with a matching taint."""

    key: str | None = Field(None, description="The taint's key (none: every taint, with operator Exists).")
    operator: Literal["Exists", "Equal"] = Field("Equal", description="Equal: the taint's value is `value`.")
    value: str | None = Field(None, description="The taint's value (operator Equal).")
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        None, description="The taint's effect (none: every effect)."
    )
    tolerationSeconds: int | None = Field(None, ge=0, description="NoExecute: how long the pods stay once tainted.")


class LocalObjectReference(Strict):
    """An object of the app's namespace, by name."""

    name: ObjectName


class EnvFromSource(Strict):
    """Every key of a Secret or a ConfigMap as environment variables (Kubernetes' EnvFromSource)."""

    model_config = cel(
        "has(self.secretRef) != has(self.configMapRef)", "set exactly one of 'secretRef' or 'configMapRef'"
    )

    secretRef: LocalObjectReference | None = Field(None, description="A Secret of the app's namespace.")
    configMapRef: LocalObjectReference | None = Field(None, description="A ConfigMap of the app's namespace.")
    prefix: str | None = Field(None, description="Put before each key's variable name.")

    @model_validator(mode="after")
    def _one(self) -> EnvFromSource:
        if (self.secretRef is None) == (self.configMapRef is None):
            raise ValueError("set exactly one of 'secretRef' or 'configMapRef'")
        return self


class Volume(Strict):
    """A volume of Spark's pods (Kubernetes' Volume, one of the sources Pod Security "restricted" admits)."""

    model_config = ConfigDict(extra="allow")  # the source: its key is checked below, its body by the API server

    name: VolumeName

    @model_validator(mode="after")
    def _one_admitted_source(self) -> Volume:
        sources = sorted((self.model_extra or {}).keys())
        if len(sources) != 1 or sources[0] not in VOLUME_SOURCES:
            raise ValueError(
                f"volume {self.name!r} needs exactly one source of {', '.join(VOLUME_SOURCES)}"
                + (f" (has {', '.join(sources)})" if sources else "")
            )
        if self.name in RESERVED_VOLUMES or self.name.startswith(RESERVED_VOLUME_PREFIXES):
            raise ValueError(f"volume name {self.name!r} is the pods' own: choose another")
        if not isinstance((self.model_extra or {})[sources[0]], dict):
            raise ValueError(f"volume {self.name!r}: {sources[0]} is an object")
        return self


class VolumeMount(Strict):
    name: VolumeName
    mountPath: str = Field(pattern=r"^/", description="An absolute path in the Spark container.")
    readOnly: bool = Field(False, description="Mounted read-only.")
    subPath: str | None = Field(None, description="A path inside the volume to mount instead of its root.")


class PodTemplate(Strict):
    labels: dict[str, str] = Field(default_factory=dict, description="Added to the driver's and executors' pods.")
    annotations: dict[str, str] = Field(default_factory=dict, description="Added to the pods.")
    nodeSelector: dict[str, str] = Field(default_factory=dict, description="Nodes the pods may run on.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment variables (no secrets: envFrom).")
    envFrom: list[EnvFromSource] = Field(default_factory=list, description="Env from Secrets and ConfigMaps.")
    tolerations: list[Toleration] = Field(default_factory=list, description="Kubernetes tolerations of the pods.")
    affinity: dict[str, Any] | None = Field(None, description="Kubernetes Affinity: nodeAffinity, podAffinity, ...")
    topologySpreadConstraints: list[dict[str, Any]] = Field(
        default_factory=list, description="Kubernetes TopologySpreadConstraints of the pods."
    )
    priorityClassName: ObjectName | None = None
    imagePullSecrets: list[ObjectName] = Field(
        default_factory=list, description="Names of Secrets in the app's namespace."
    )
    volumes: list[Volume] = Field(default_factory=list, description="Extra volumes of the pods.")
    volumeMounts: list[VolumeMount] = Field(
        default_factory=list, description="Mounts of `volumes` in Spark's container."
    )
    runAsUser: int = Field(
        185,
        ge=1,
        description="The uid (and gid) Spark's pods run as: never root (the apache/spark images' spark user is 185).",
    )
    fsGroup: int = Field(185, ge=1, description="The group volumes (the checkpoint claim) are writable by.")
    readOnlyRootFilesystem: bool = Field(
        True,
        description="Spark's container cannot write its image's files; /tmp and the working directory are "
        "emptyDir volumes (false: for an image that writes elsewhere).",
    )

    @field_validator("affinity")
    @classmethod
    def _affinity_kinds(cls, affinity: dict[str, Any] | None) -> dict[str, Any] | None:
        unknown = sorted(set(affinity or {}) - {"nodeAffinity", "podAffinity", "podAntiAffinity"})
        if unknown:
            raise ValueError(f"unknown affinity {', '.join(unknown)}: nodeAffinity, podAffinity or podAntiAffinity")
        return affinity

    @field_validator("topologySpreadConstraints")
    @classmethod
    def _spread_fields(cls, constraints: list[dict[str, Any]]) -> list[dict[str, Any]]:
        for index, constraint in enumerate(constraints):
            missing = [k for k in ("maxSkew", "topologyKey", "whenUnsatisfiable") if k not in constraint]
            if missing:
                raise ValueError(f"[{index}] needs {', '.join(missing)}")
        return constraints

    @model_validator(mode="after")
    def _mounts_name_volumes(self) -> PodTemplate:
        names = [v.name for v in self.volumes]
        if len(set(names)) != len(names):
            raise ValueError(
                f"volumes: a name used twice ({', '.join(sorted({n for n in names if names.count(n) > 1}))})"
            )
        for index, mount in enumerate(self.volumeMounts):
            if mount.name not in names:
                raise ValueError(f"volumeMounts[{index}]: no volume named {mount.name!r} in volumes")
        return self
