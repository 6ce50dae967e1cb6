"""kubectl for the CLI's cluster reads: the user's kubeconfig, context and auth plugins work as for kubectl."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from typing import Any


class KubectlError(Exception):
    """kubectl is missing or failed; the message says what to do."""


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--namespace", help="the apps' namespace where the manifest names none")
    parser.add_argument("--context", help="the kubeconfig context (kubectl's default)")
    parser.add_argument("--kubeconfig", help="the kubeconfig file (kubectl's default)")


def kubectl(args: argparse.Namespace, namespace: str | None, *command: str, without: str = "") -> str:
    """kubectl's output. `without`: what to do instead, said when kubectl is not on PATH."""
    binary = shutil.which("kubectl")
    if binary is None:
        raise KubectlError("kubectl is not on PATH: install it" + (f", or {without}" if without else ""))
    flags = [f"--{key}={value}" for key in ("context", "kubeconfig") if (value := getattr(args, key, None))]
    if namespace:
        flags.append(f"--namespace={namespace}")
    result = subprocess.run([binary, *flags, *command], capture_output=True, text=True)
    if result.returncode != 0:
        raise KubectlError(f"kubectl {' '.join(command)}: {result.stderr.strip() or 'failed'}")
    return result.stdout


def kubectl_json(args: argparse.Namespace, namespace: str | None, *command: str, without: str = "") -> dict[str, Any]:
    return dict(json.loads(kubectl(args, namespace, *command, "-o", "json", without=without)))
