"""spec.kafka: how the app's driver reaches its Kafka cluster and logs in (TLS, SASL, mTLS), each secret
named by its Secret, never copied; or a Strimzi cluster whose listener says it all."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from .spec_types import ObjectName, SecretKey, Strict, cel


class StrimziCluster(Strict):
    """A Kafka cluster Strimzi manages: its bootstrap Service, and KafkaTopic resources for the app's topics."""

    name: str = Field(description="Name of the Strimzi Kafka resource.")
    namespace: str | None = Field(None, description="Default: the app's namespace.")
    listener: str = Field("plain", description="Listener whose bootstrap address the app uses.")


class PasswordSecretSource(Strict):
    secretName: ObjectName = Field(description="A Secret in the app's namespace.")
    password: SecretKey


class CertSecretSource(Strict):
    secretName: ObjectName = Field(description="A Secret in the app's namespace.")
    certificate: SecretKey = Field(description="Its key holding PEM certificates, e.g. ca.crt.")


class CertAndKeySecretSource(Strict):
    secretName: ObjectName = Field(description="A Secret in the app's namespace (a Strimzi KafkaUser's).")
    certificate: SecretKey = Field(description="Its key holding the PEM client certificate, e.g. user.crt.")
    key: SecretKey = Field(description="Its key holding the PEM private key (PKCS#8), e.g. user.key.")


class KafkaTls(Strict):
    """TLS to the brokers, as Strimzi's KafkaConnect writes it."""

    trustedCertificates: list[CertSecretSource] = Field(
        default_factory=list,
        max_length=20,
        description="CA certificates the brokers' certificates are checked against. Default: with strimziCluster, "
        "the cluster CA (Secret <cluster>-cluster-ca-cert, key ca.crt); otherwise the image's system CAs.",
    )


class KafkaAuthentication(Strict):
    """How every Kafka client of the app logs in (the operator's, the driver's, Spark's), as Strimzi's
    KafkaConnect writes it. Secrets are mounted into the driver pod and read by the operator; their values are
    never copied into the app's objects."""

    model_config = cel(
        (
            "self.type == 'tls' ? has(self.certificateAndKey) : has(self.username) && has(self.passwordSecret)",
            "type tls needs certificateAndKey; scram-sha-512, scram-sha-256 and plain need username and passwordSecret",
        ),
    )

    type: Literal["tls", "scram-sha-512", "scram-sha-256", "plain"] = Field(
        description="tls: a client certificate (mTLS); scram-sha-512, scram-sha-256, plain: SASL with a password."
    )
    username: str | None = Field(None, min_length=1, max_length=1024, description="The SASL user.")
    passwordSecret: PasswordSecretSource | None = Field(None, description="The SASL user's password.")
    certificateAndKey: CertAndKeySecretSource | None = Field(None, description="The client certificate (type tls).")

    @model_validator(mode="after")
    def _credentials_of_type(self) -> KafkaAuthentication:
        if self.type == "tls":
            if self.certificateAndKey is None:
                raise ValueError("type tls needs certificateAndKey (the client certificate and its key)")
            if self.username or self.passwordSecret:
                raise ValueError("type tls logs in with certificateAndKey: username and passwordSecret are not used")
        else:
            missing = [name for name in ("username", "passwordSecret") if getattr(self, name) is None]
            if missing:
                raise ValueError(f"type {self.type} needs {' and '.join(missing)}")
            if self.certificateAndKey:
                raise ValueError(f"type {self.type} logs in with a password: certificateAndKey is for type tls")
        return self

    @property
    def sasl_mechanism(self) -> str | None:
        return None if self.type == "tls" else self.type.upper()


class KafkaSpec(Strict):
    """Which Kafka the app uses: an external cluster, or a Strimzi-managed one; and how its clients reach it."""

    model_config = cel(
        (
            "has(self.bootstrapServers) != has(self.strimziCluster)",
            "set exactly one of 'bootstrapServers' or 'strimziCluster'",
        ),
        (
            "!has(self.authentication) || self.authentication.type != 'tls' || has(self.tls)",
            "authentication type tls (mTLS) needs tls",
        ),
    )

    bootstrapServers: str | None = Field(None, description="host:port[,host:port] of an external cluster.")
    strimziCluster: StrimziCluster | None = None
    tls: KafkaTls | None = Field(None, description="Connect over TLS. Default: plaintext.")
    authentication: KafkaAuthentication | None = Field(None, description="Default: none.")

    @model_validator(mode="after")
    def _one(self) -> KafkaSpec:
        if (self.bootstrapServers is None) == (self.strimziCluster is None):
            raise ValueError("set exactly one of 'bootstrapServers' or 'strimziCluster'")
        if self.authentication and self.authentication.type == "tls" and self.tls is None:
            raise ValueError("authentication type tls (mTLS) needs tls")
        return self

    def trusted_certificates(self) -> list[CertSecretSource]:
        """The CAs the brokers are checked against: the spec's, else a Strimzi cluster's CA."""
        if self.tls is None:
            return []
        if self.tls.trustedCertificates or self.strimziCluster is None:
            return list(self.tls.trustedCertificates)
        return [CertSecretSource(secretName=f"{self.strimziCluster.name}-cluster-ca-cert", certificate="ca.crt")]

    def address(self) -> dict[str, Any]:
        """Where the cluster is, as written (not how its clients log in)."""
        return self.model_dump(mode="json", exclude_none=True, include={"bootstrapServers", "strimziCluster"})
