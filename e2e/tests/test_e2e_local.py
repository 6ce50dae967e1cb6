"""`make e2e-local`: the end-to-end suite (sluice.testbed.e2e_suite, shared with the kind run) on real pods
here, without Docker.

A throwaway single-node cluster (what `make local-cluster` runs) gets the images built with buildah
(sluice.testbed.local_images: the sluice operator and Spark images from images/*/Dockerfile, and the
spark-operator built from its Go module) imported into its containerd. spark-operator is installed with its
own chart, sluice with charts/sluice. Kafka is a broker of the test bed listening on the node address (no
Kafka image or Strimzi operator image can be pulled here): pods get only SASL_SSL there, and apps log in with
SCRAM over TLS, their password and CA from Secrets (spec.kafka.tls, spec.kafka.authentication), with topics
managed through the Admin API; this process reads and writes through its loopback listener. The apps'
namespace enforces Pod Security "restricted". Claims bind to node-local
volumes of the cluster's default StorageClass (local-path, as on kind). The chart's monitors and alerts
configure a Prometheus built from its Go module (sluice.testbed.prometheus), which scrapes the operator and
the drivers through the enforced NetworkPolicies. Everything is torn down afterwards.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from sluice.testbed.common import REPO_ROOT, ProvisionError
from sluice.testbed.e2e_suite import E2ESuite
from sluice.testbed.local_images import LocalImagesRun
from sluice.testbed.local_run import local_cluster_run

pytestmark = [pytest.mark.kube, pytest.mark.e2e_local]

REPORTS = REPO_ROOT / ".sluice" / "e2e"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalImagesRun]:
    try:
        with local_cluster_run(tmp_path_factory.mktemp("e2e-local")) as run:
            yield run
    except ProvisionError as error:
        pytest.fail(str(error), pytrace=False)


@pytest.fixture(scope="module")
def suite(local_run: LocalImagesRun) -> E2ESuite:
    return local_run.suite()


@pytest.mark.parametrize("step", E2ESuite.step_params())
def test_step(suite: E2ESuite, step: str) -> None:
    if suite.failed:
        pytest.skip(f"step {suite.failed} failed")
    try:
        suite.run(step)
    finally:
        suite.write_report(step, REPORTS)  # the figures, for the record (also of a failed run)
