"""Fault injection for Spark's Python workers in the fault suite (on their PYTHONPATH only there).

With $SLUICE_FAULT_DIR set, every Kafka producer in the worker pauses around commit_transaction when the
test has dropped a trigger file there: `before-commit` (the transaction holds its records, uncommitted) or
`after-commit` (committed, but the task has not reported back to Spark yet). One worker claims the trigger,
writes `paused` (its pid and the phase) and sleeps, so that the test can kill its executor at that moment.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

FAULT_DIR = os.environ.get("SLUICE_FAULT_DIR")
PAUSE_S = 120.0


def _pause_if_asked(phase: str) -> None:
    assert FAULT_DIR is not None
    trigger = Path(FAULT_DIR, phase)
    try:
        trigger.rename(Path(FAULT_DIR, f"{phase}.claimed-{os.getpid()}"))  # one worker wins
    except FileNotFoundError:
        return
    paused = Path(FAULT_DIR, "paused")
    paused.with_suffix(".tmp").write_text(json.dumps({"pid": os.getpid(), "phase": phase}))
    paused.with_suffix(".tmp").rename(paused)
    time.sleep(PAUSE_S)


if FAULT_DIR:
    import confluent_kafka

    class PausingProducer(confluent_kafka.Producer):
        def commit_transaction(self, *args: float) -> None:
            _pause_if_asked("before-commit")
            super().commit_transaction(*args)
            _pause_if_asked("after-commit")

    confluent_kafka.Producer = PausingProducer  # type: ignore[misc]
