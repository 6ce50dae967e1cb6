"""Durations as a StreamingApp writes them (500ms, 5s, 10m, 2h, 1d; signed: -5s) and instants as statuses and
the driver's answers carry them (RFC 3339 in UTC, e.g. 2026-11-29T18:00:00.250Z)."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from pydantic import Field, StringConstraints

DURATION_PATTERN = r"^[0-9]+(ms|s|m|h|d)$"
SIGNED_DURATION_PATTERN = r"^-?[0-9]+(ms|s|m|h|d)$"
_UNIT_WORDS = {"ms": "milliseconds", "s": "seconds", "m": "minutes", "h": "hours", "d": "days"}
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}

Duration = Annotated[
    str, StringConstraints(pattern=DURATION_PATTERN), Field(description="A duration such as 500ms, 5s, 10m, 2h or 1d.")
]
SignedDuration = Annotated[
    str,
    StringConstraints(pattern=SIGNED_DURATION_PATTERN),
    Field(description="A duration, negative for before: -5s, 0s, 10m."),
]


def duration_to_spark(value: str) -> str:
    """'5s' -> '5 seconds' (Spark interval syntax)."""
    number, unit = _split_duration(value)
    return f"{number} {_UNIT_WORDS[unit]}"


def duration_ms(value: str) -> int:
    number, unit = _split_duration(value)
    return number * _UNIT_MS[unit]


def signed_duration_ms(value: str) -> int:
    """'-5s' -> -5000."""
    return -duration_ms(value[1:]) if value.startswith("-") else duration_ms(value)


def _split_duration(value: str) -> tuple[int, str]:
    match = re.fullmatch(r"([0-9]+)(ms|s|m|h|d)", value)
    if not match:
        raise ValueError(f"invalid duration {value!r}: use a number and a unit (ms, s, m, h, d), e.g. 5s")
    return int(match.group(1)), match.group(2)


def parse_time(rfc3339: str) -> float:
    """Seconds since the epoch; an instant without a zone is UTC. Raises ValueError."""
    moment = datetime.fromisoformat(rfc3339)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def format_time(epoch_seconds: float) -> str:
    """RFC 3339 in UTC, to the millisecond: 2026-11-29T18:00:00.250Z."""
    return datetime.fromtimestamp(epoch_seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def format_time_seconds(epoch_seconds: float) -> str:
    """RFC 3339 in UTC, to the second (Kubernetes' metav1.Time): 2026-11-29T18:00:00Z."""
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
