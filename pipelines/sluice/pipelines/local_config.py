"""The RunnerConfig of a local run (`sluice run`, the runner given a file): made from a StreamingApp manifest or
a bare pipeline file, where the operator would have written one."""

from __future__ import annotations

import os
from typing import Any

from sluice.api.contract import KafkaSecurity, RunnerConfig
from sluice.api.kafka_clients import KAFKA_SECRETS_MOUNT, kafka_security
from sluice.api.kafka_spec import KafkaSpec
from sluice.api.validation import PipelineDocument, PipelineInvalid, Problem, model_problems, validate

LOCAL_REVISION = "local"  # the revision of a run made from a file rather than by the operator


def config_from_document(
    document: PipelineDocument,
    *,
    checkpoint_root: str,
    bootstrap_servers: str | None = None,
    control_port: int = 0,
    control_token_file: str | None = None,
) -> RunnerConfig:
    """A manifest or bare pipeline (validated without Spark) as the RunnerConfig a local run runs.

    The Kafka bootstrap is decided here: the flag, else the manifest's spec.kafka.bootstrapServers, else
    $SLUICE_KAFKA_BOOTSTRAP.
    """
    spec = validate(document.pipeline, document.prefix)
    manifest = document.manifest or {}
    kafka = (manifest.get("spec") or {}).get("kafka") or {}
    bootstrap = bootstrap_servers or kafka.get("bootstrapServers") or os.environ.get("SLUICE_KAFKA_BOOTSTRAP")
    if not bootstrap:
        raise PipelineInvalid(
            [
                Problem(
                    "spec.kafka.bootstrapServers" if manifest else "--bootstrap-servers",
                    "no Kafka bootstrap: pass --bootstrap-servers, set "
                    "spec.kafka.bootstrapServers or $SLUICE_KAFKA_BOOTSTRAP",
                )
            ]
        )
    return RunnerConfig(
        app=document.app_name,
        namespace=(manifest.get("metadata") or {}).get("namespace") or "default",
        revision=LOCAL_REVISION,
        kafkaBootstrap=bootstrap,
        kafkaSecurity=local_kafka_security(kafka) if bootstrap == kafka.get("bootstrapServers") else KafkaSecurity(),
        pipeline=spec,
        checkpointRoot=checkpoint_root,
        controlPort=control_port,
        controlTokenFile=control_token_file,
    )


def local_kafka_security(kafka: dict[str, Any]) -> KafkaSecurity:
    """The manifest's spec.kafka login for a local run of its own cluster: the Secrets' keys are read from
    $SLUICE_KAFKA_SECRETS/<secretName>/<key> (default: where the operator mounts them in the driver pod)."""
    parsed, problems = model_problems(kafka, "spec.kafka", KafkaSpec)
    if problems:
        raise PipelineInvalid(problems)
    return kafka_security(parsed, os.environ.get("SLUICE_KAFKA_SECRETS", KAFKA_SECRETS_MOUNT))[0]
