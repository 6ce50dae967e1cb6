"""The secured Kafka of the production-shaped world: a CA of the test bed's own, broker certificates that name
the addresses clients dial, SCRAM-SHA-512 users, and the client settings that log in with them."""

from __future__ import annotations

import ipaddress
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sluice.pipelines.local.kafka import SCRAM_MECHANISM, SecuredListener

from .kube import issue_cert, write_key_pair

CA_FILE = "kafka-ca.crt"
KEYSTORE_FILE = "kafka-broker.pem"  # key and chain in one PEM file, as Kafka's PEM keystore reads it


def _subject_names(hosts: Iterable[str]) -> list[Any]:
    from cryptography import x509

    names: list[Any] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def write_kafka_pki(directory: Path, hosts: Iterable[str]) -> tuple[Path, Path]:
    """A CA and one broker certificate valid for every name in `hosts`; returns (truststore, keystore)."""
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = issue_cert("sluice-testbed-kafka-ca", ca_key, signer=None, usage="ca")
    broker_key = ec.generate_private_key(ec.SECP256R1())
    broker = issue_cert("kafka", broker_key, signer=(ca, ca_key), usage="server", sans=_subject_names(hosts))
    write_key_pair(directory, "kafka-ca", ca, ca_key)
    write_key_pair(directory, "kafka-broker", broker, broker_key)
    keystore = directory / KEYSTORE_FILE
    keystore.write_bytes(
        (directory / "kafka-broker.key").read_bytes()
        + (directory / "kafka-broker.crt").read_bytes()
        + (directory / CA_FILE).read_bytes()
    )
    keystore.chmod(0o600)
    return directory / CA_FILE, keystore


def scram_over_tls(bootstrap: str, username: str, user_secret: str, ca_secret: str) -> dict[str, Any]:
    """spec.kafka logging in with SCRAM-SHA-512 over TLS, as Strimzi users write it for KafkaConnect: the
    password in Secret `user_secret` (key password), the brokers' CA in Secret `ca_secret` (key ca.crt)."""
    return {
        "bootstrapServers": bootstrap,
        "tls": {"trustedCertificates": [{"secretName": ca_secret, "certificate": "ca.crt"}]},
        "authentication": {
            "type": SCRAM_MECHANISM.lower(),
            "username": username,
            "passwordSecret": {"secretName": user_secret, "password": "password"},
        },
    }


def client_certificate(listener: SecuredListener, user: str) -> tuple[str, str]:
    """A client certificate for `user` (its subject CN) signed by the listener's CA, and its PKCS#8 key: PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = listener.truststore.parent
    ca = x509.load_pem_x509_certificate(listener.truststore.read_bytes())
    ca_key = serialization.load_pem_private_key((directory / "kafka-ca.key").read_bytes(), password=None)
    key = ec.generate_private_key(ec.SECP256R1())
    certificate = issue_cert(user, key, signer=(ca, ca_key), usage="client")
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return certificate.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


def secured_listener(directory: Path, hosts: Iterable[str], users: Iterable[str]) -> SecuredListener:
    """Certificates for `hosts` and a fresh random password for each SCRAM user."""
    truststore, keystore = write_kafka_pki(directory, hosts)
    return SecuredListener(
        keystore=keystore, truststore=truststore, users={name: secrets.token_urlsafe(18) for name in users}
    )


def scram_client_settings(listener: SecuredListener, user: str, password: str | None = None) -> dict[str, str]:
    """librdkafka settings that log in as `user` over TLS, verifying the brokers' names against the CA."""
    return {
        "security.protocol": "SASL_SSL",
        "sasl.mechanisms": SCRAM_MECHANISM,
        "sasl.username": user,
        "sasl.password": listener.users[user] if password is None else password,
        "ssl.ca.location": str(listener.truststore),
        "ssl.endpoint.identification.algorithm": "https",
    }
