"""`python -m sluice.operator`: run the StreamingApp operator (kopf) against the current kubeconfig."""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

import kopf
from prometheus_client import start_http_server


def ensure_peering(name: str, namespaces: list[str]) -> None:
    """kopf needs the peering object to exist; create it once (clusterwide, or in each namespace)."""
    from .kube import Kube, KubeError

    api_version = "kopf.dev/v1"
    peerings = [
        {"apiVersion": api_version, "kind": "KopfPeering", "metadata": {"name": name, "namespace": namespace}}
        for namespace in namespaces
    ] or [{"apiVersion": api_version, "kind": "ClusterKopfPeering", "metadata": {"name": name}}]
    kube = Kube()
    try:
        for peering in peerings:
            try:
                kube.create(peering)
            except KubeError as exc:
                if exc.status != 409:  # 409: it exists already
                    raise
    finally:
        kube.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.operator")
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument(
        "--namespace",
        "-n",
        action="append",
        dest="namespaces",
        help="watch this namespace (repeatable); default: all namespaces",
    )
    scope.add_argument("--all-namespaces", "-A", action="store_true")
    parser.add_argument(
        "--peering", help="kopf peering name for HA (several replicas, one active); default: standalone"
    )
    parser.add_argument("--priority", type=int, default=None, help="peering priority (default: random)")
    parser.add_argument("--metrics-port", type=int, default=8080, help="Prometheus metrics (0: off)")
    parser.add_argument("--liveness", default="http://0.0.0.0:8081/healthz", help="kopf liveness endpoint")
    parser.add_argument(
        "--webhook-port",
        type=int,
        default=0,
        help="serve the validating admission webhook over HTTPS on this port (0: off)",
    )
    parser.add_argument(
        "--webhook-cert-dir", type=Path, help="the webhook's certificate: tls.crt and tls.key in this directory"
    )
    parser.add_argument("--webhook-address", default="0.0.0.0", help="the webhook's listening address")
    parser.add_argument("--log-format", choices=["json", "plain", "full"], default="json")
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if args.webhook_port and not args.webhook_cert_dir:
        parser.error("--webhook-port needs --webhook-cert-dir")

    from . import handlers, watch_transform  # noqa: F401  (importing handlers registers them)

    watch_transform.install()

    settings = kopf.OperatorSettings()
    if args.webhook_port:
        from . import admission  # registers the admission handler: only with a server to answer for it

        settings.admission.server = admission.webhook_server(
            args.webhook_port, args.webhook_cert_dir, args.webhook_address
        )
    kopf.configure(verbose=args.verbose, log_format=kopf.LogFormat[args.log_format.upper()])
    if args.peering:
        ensure_peering(args.peering, args.namespaces or [])
    if args.metrics_port:
        start_http_server(args.metrics_port)
    kopf.run(
        settings=settings,
        clusterwide=not args.namespaces,
        namespaces=args.namespaces or [],
        standalone=not args.peering,
        peering_name=args.peering,
        priority=args.priority if args.priority is not None else random.randint(1, 10_000),
        liveness_endpoint=args.liveness or None,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
