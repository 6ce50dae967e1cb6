"""How every Kafka client of an app connects and logs in: the one place that turns spec.kafka into client settings.

    spec.kafka ──kafka_security──▶ KafkaSecurity (the contract: protocol, user, credential files) + SecretFiles
    KafkaSecurity ──read_credentials(read)──▶ KafkaCredentials (the driver reads the mounted files; the operator
                                              reads the same paths from the Secrets through the API server)
    KafkaClient(bootstrap, security, credentials) ──▶ .librdkafka() (confluent-kafka: admin, lag, producers)
                                                  ──▶ .java() / .spark_options() (Spark's source and sink, the
                                                      migration's offset lookup)

Credentials travel as values only in memory (and in the Spark plan, which Spark redacts): TLS material goes
inline (PEM), so executors need no mounted files.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from .contract import KafkaSecurity
from .kafka_spec import KafkaSpec

KAFKA_SECRETS_MOUNT = "/etc/sluice-kafka"  # the driver pod's mount of each Secret spec.kafka names: <mount>/<name>/


@dataclass(frozen=True)
class SecretFile:
    """A credential file of the driver pod: which Secret key it is, and the spec field that named it."""

    field: str
    secret: str
    key: str


SecretFiles = dict[str, SecretFile]  # path in the driver pod -> where it comes from
AUTH = "spec.kafka.authentication"


def kafka_security(kafka: KafkaSpec, mount: str = KAFKA_SECRETS_MOUNT) -> tuple[KafkaSecurity, SecretFiles]:
    """The contract's KafkaSecurity for spec.kafka, and the Secret keys its files are (to mount, or to read)."""
    files: SecretFiles = {}

    def file(field_path: str, secret: str, key: str) -> str:
        path = f"{mount}/{secret}/{key}"
        files.setdefault(path, SecretFile(field_path, secret, key))
        return path

    trusted = [
        file(f"spec.kafka.tls.trustedCertificates[{i}]", cert.secretName, cert.certificate)
        for i, cert in enumerate(kafka.trusted_certificates())
    ]
    auth = kafka.authentication
    sasl = auth is not None and auth.type != "tls"
    protocol = ("SASL_" if sasl else "") + ("SSL" if kafka.tls is not None else "PLAINTEXT")
    password = auth.passwordSecret if auth else None
    client = auth.certificateAndKey if auth else None
    security = KafkaSecurity(
        protocol=protocol,
        saslMechanism=auth.sasl_mechanism if auth else None,
        username=auth.username if auth else None,
        passwordFile=file(f"{AUTH}.passwordSecret", password.secretName, password.password) if password else None,
        trustedCertificateFiles=trusted,
        certificateFile=file(f"{AUTH}.certificateAndKey", client.secretName, client.certificate) if client else None,
        keyFile=file(f"{AUTH}.certificateAndKey", client.secretName, client.key) if client else None,
    )
    return security, files


class CredentialUnreadable(ValueError):
    """A credential file (a Secret's key) that is missing or empty: the message names the spec field."""


@dataclass(frozen=True)
class KafkaCredentials:
    """The secret values: kept out of repr, logs and every object written."""

    password: str | None = field(default=None, repr=False)
    trusted_pem: str | None = field(default=None, repr=False)
    certificate_pem: str | None = field(default=None, repr=False)
    key_pem: str | None = field(default=None, repr=False)


def read_credentials(
    security: KafkaSecurity, read: Callable[[str], str], name: Callable[[str], str] = str
) -> KafkaCredentials:
    """The credentials `security` names, each file read with `read` (which raises CredentialUnreadable);
    `name`: a file as an error names it."""

    def pem(path: str) -> str:
        text = read(path)
        if "-----BEGIN " not in text:
            raise CredentialUnreadable(f"{name(path)}: not PEM (no -----BEGIN line)")
        return text.strip() + "\n"

    trusted = "".join(pem(path) for path in security.trustedCertificateFiles) or None
    return KafkaCredentials(
        password=read(security.passwordFile).rstrip("\r\n") if security.passwordFile else None,
        trusted_pem=trusted,
        certificate_pem=pem(security.certificateFile) if security.certificateFile else None,
        key_pem=pem(security.keyFile) if security.keyFile else None,
    )


def read_file(path: str) -> str:
    """A mounted credential file (the driver's `read`)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise CredentialUnreadable(f"{path}: {exc.strerror or exc}") from exc
    if not text.strip():
        raise CredentialUnreadable(f"{path}: empty")
    return text


_JAAS_MODULES = {
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
}


def _quoted(value: str) -> str:
    """A JAAS option value: double-quoted, with Java's escapes (StreamTokenizer reads \\" and \\\\)."""
    return json.dumps(value, ensure_ascii=False)


@dataclass(frozen=True)
class KafkaClient:
    """One Kafka cluster as the app's clients reach it."""

    bootstrap: str
    security: KafkaSecurity = field(default_factory=KafkaSecurity)
    credentials: KafkaCredentials = field(default_factory=KafkaCredentials, repr=False)

    def at(self, bootstrap: str | None) -> KafkaClient:
        """The same login at another address (a node's own bootstrapServers)."""
        return replace(self, bootstrap=bootstrap) if bootstrap else self

    @property
    def tls(self) -> bool:
        return self.security.protocol in ("SSL", "SASL_SSL")

    def _protocol(self, spelled: Callable[[str], str]) -> dict[str, str]:
        """security.protocol, where it is not the clients' default (plaintext)."""
        protocol = self.security.protocol
        return {} if protocol == "PLAINTEXT" else {"security.protocol": spelled(protocol)}

    def librdkafka(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings."""
        settings = {"bootstrap.servers": self.bootstrap} | self._protocol(str.lower)
        creds = self.credentials
        if self.security.saslMechanism:
            settings |= {"sasl.mechanism": self.security.saslMechanism, "sasl.username": self.security.username or ""}
            settings["sasl.password"] = creds.password or ""
        if creds.trusted_pem:
            settings["ssl.ca.pem"] = creds.trusted_pem
        if creds.certificate_pem and creds.key_pem:
            settings |= {"ssl.certificate.pem": creds.certificate_pem, "ssl.key.pem": creds.key_pem}
        return settings

    def java(self) -> dict[str, str]:
        """Kafka Java client properties (PEM inline, so no file is needed where the client runs)."""
        settings = {"bootstrap.servers": self.bootstrap} | self._protocol(str)
        creds = self.credentials
        mechanism = self.security.saslMechanism
        if mechanism:
            username, password = _quoted(self.security.username or ""), _quoted(creds.password or "")
            settings["sasl.mechanism"] = mechanism
            settings["sasl.jaas.config"] = (
                f"{_JAAS_MODULES[mechanism]} required username={username} password={password};"
            )
        if creds.trusted_pem:
            settings |= {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": creds.trusted_pem}
        if creds.certificate_pem and creds.key_pem:
            settings |= {
                "ssl.keystore.type": "PEM",
                "ssl.keystore.certificate.chain": creds.certificate_pem,
                "ssl.keystore.key": creds.key_pem,
            }
        return settings

    def spark_options(self) -> dict[str, str]:
        """Options of Spark's Kafka source and sink (kafka.-prefixed Java properties)."""
        return {f"kafka.{key}": value for key, value in self.java().items()}


def client_at(kafka: KafkaClient | None, bootstrap: str | None) -> KafkaClient:
    """The client a node uses: the app's login at the node's own bootstrapServers (else the app's address), or a
    plaintext client of the node's address where the run has no Kafka of its own (plan checks, tests); an empty
    bootstrap when neither names one."""
    return kafka.at(bootstrap) if kafka else KafkaClient(bootstrap or "")


# Spark redacts these option values in plans and the UI (spark.sql.redaction.options.regex): the login material.
SPARK_REDACTED_OPTIONS = (
    r"(?i)url|jaas|password|ssl\.keystore\.key|ssl\.truststore\.certificates|ssl\.keystore\.certificate"
)
