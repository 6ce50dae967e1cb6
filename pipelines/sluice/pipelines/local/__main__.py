"""`python -m sluice.pipelines.local kafka up|down|status`: the developer broker (make local-kafka)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from . import kafka
from .provision import run_command


def kafka_command(args: argparse.Namespace) -> int:
    state_dir = Path(args.state_dir)
    if args.action == "up":
        bootstrap = kafka.local_up(state_dir, size=args.brokers, host=args.host)
        print(f"Kafka {kafka.KAFKA} (KRaft, {args.brokers} node(s)) is up. bootstrap: {bootstrap}")
        print(f"stop it with: make local-kafka-down   (logs in {state_dir})")
    elif args.action == "down":
        print("Kafka stopped" if kafka.local_down(state_dir) else "no local Kafka was running")
    else:
        running = kafka.local_bootstrap(state_dir)
        print(f"running, bootstrap: {running}" if running else "not running")
        return 0 if running else 1
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sluice.pipelines.local")
    sub = parser.add_subparsers(dest="command", required=True)

    kafka_parser = sub.add_parser("kafka", help="local KRaft broker")
    kafka_parser.add_argument("action", choices=["up", "down", "status"])
    kafka_parser.add_argument("--brokers", type=int, choices=[1, 3], default=1)
    kafka_parser.add_argument("--state-dir", default=str(kafka.LOCAL_KAFKA_DIR))
    kafka_parser.add_argument(
        "--host", default="127.0.0.1", help="address clients reach the broker on (the local cluster's pods: 10.245.0.1)"
    )
    kafka_parser.set_defaults(func=kafka_command)

    return run_command(parser, argv)


if __name__ == "__main__":
    sys.exit(main())
