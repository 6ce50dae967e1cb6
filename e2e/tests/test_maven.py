"""Pure helpers of the Maven fetcher."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

from sluice.pipelines.local.maven import artifact_name, render_pom


@pytest.mark.parametrize(
    ("jar", "artifact"),
    [
        ("kafka-clients-3.9.0.jar", "kafka-clients"),
        ("spark-sql-kafka-0-10_2.13-4.0.0.jar", "spark-sql-kafka-0-10_2.13"),
        ("javax.inject-1.jar", "javax.inject"),
        ("zstd-jni-1.5.6-4.jar", "zstd-jni"),
        ("netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar", "netty-transport-native-epoll"),
    ],
)
def test_artifact_name(jar, artifact):
    assert artifact_name(jar) == artifact


def test_render_pom_lists_each_dependency():
    pom = ET.fromstring(render_pom("x", ["org.apache.kafka:kafka_2.13:4.1.1", "a.b:c-d:1.0"]))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    deps = [
        (
            d.findtext("m:groupId", namespaces=ns),
            d.findtext("m:artifactId", namespaces=ns),
            d.findtext("m:version", namespaces=ns),
        )
        for d in pom.iterfind(".//m:dependency", ns)
    ]
    assert deps == [("org.apache.kafka", "kafka_2.13", "4.1.1"), ("a.b", "c-d", "1.0")]


def test_render_pom_excludes_artifacts_from_every_dependency():
    pom = ET.fromstring(render_pom("x", ["a:b:1", "c:d:2"], excluding=["e.f:bundle"]))
    ns = {"m": "http://maven.apache.org/POM/4.0.0"}
    exclusions = [
        [(x.findtext("m:groupId", namespaces=ns), x.findtext("m:artifactId", namespaces=ns)) for x in excluded]
        for excluded in (d.iterfind(".//m:exclusion", ns) for d in pom.iterfind(".//m:dependency", ns))
    ]
    assert exclusions == [[("e.f", "bundle")], [("e.f", "bundle")]]


def test_render_pom_rejects_bad_coordinates():
    with pytest.raises(ValueError, match="group:artifact:version"):
        render_pom("x", ["only:two"])
    with pytest.raises(ValueError, match="group:artifact,"):
        render_pom("x", ["a:b:1"], excluding=["a:b:1"])
