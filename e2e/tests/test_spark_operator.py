"""The spark-operator binary built from its Go module, and the wrapper go.mod that builds it."""

from __future__ import annotations

import subprocess

import pytest

from sluice.testbed.common import ProvisionError
from sluice.testbed.external_crds import SPARK_OPERATOR_MODULE
from sluice.testbed.kube import replace_directives
from sluice.testbed.spark_operator import operator_wrapper_gomod, spark_operator_binary
from sluice.testbed.versions import SPARK_OPERATOR

GOMOD = """module github.com/kubeflow/spark-operator/v2

go 1.24.10

tool k8s.io/code-generator

require (
\tk8s.io/api v0.32.5
\tk8s.io/client-go v0.32.5 // pinned
)

replace (
\tk8s.io/api => k8s.io/api v0.32.5
\tk8s.io/client-go v0.33.0 => k8s.io/client-go v0.32.5 // pinned
)

replace github.com/foo/bar => github.com/fork/bar v1.2.4
"""


def test_replace_directives_reads_block_and_single_line_forms() -> None:
    assert replace_directives(GOMOD) == [
        "k8s.io/api => k8s.io/api v0.32.5",
        "k8s.io/client-go v0.33.0 => k8s.io/client-go v0.32.5",
        "github.com/foo/bar => github.com/fork/bar v1.2.4",
    ]


def test_wrapper_requires_the_pinned_module_and_repeats_its_replaces() -> None:
    wrapper = operator_wrapper_gomod(GOMOD, "v9.9.9")

    assert "\ngo 1.24.10\n" in wrapper
    assert f"\nrequire {SPARK_OPERATOR_MODULE} v9.9.9\n" in wrapper
    assert "tool " not in wrapper
    assert "\tk8s.io/client-go v0.33.0 => k8s.io/client-go v0.32.5\n" in wrapper
    assert "\tgithub.com/foo/bar => github.com/fork/bar v1.2.4\n" in wrapper


def test_local_path_replace_is_one_clear_line() -> None:
    with pytest.raises(ProvisionError, match=r"replaces 'k8s.io/api => \./staging/api' with a local path") as caught:
        operator_wrapper_gomod(GOMOD + "replace k8s.io/api => ./staging/api\n")

    assert "\n" not in str(caught.value)


@pytest.mark.kube
def test_binary_runs_and_reports_the_pinned_version() -> None:
    binary = spark_operator_binary()

    usage = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=60)
    version = subprocess.run([binary, "version"], capture_output=True, text=True, timeout=60)

    assert usage.returncode == 0, usage.stderr
    assert "controller" in usage.stdout and "webhook" in usage.stdout
    assert f"Git Version: v{SPARK_OPERATOR}\n" in version.stdout
    assert "Git Tree State: clean\n" in version.stdout
