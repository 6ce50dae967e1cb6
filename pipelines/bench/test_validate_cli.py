"""`sluice validate --no-spark` over every example, as a person runs it (a new process each time): under 2 s."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
REPORT = Path(__file__).resolve().parents[2] / ".sluice" / "bench" / "validate.json"
TARGET_S = 2.0

pytestmark = pytest.mark.bench


def test_validate_without_spark_answers_in_under_2_s() -> None:
    files = sorted(map(str, EXAMPLES.glob("*.yaml")))
    runs = []
    for _ in range(5):
        began = time.monotonic()
        result = subprocess.run(
            [sys.executable, "-m", "sluice.pipelines.cli", "validate", "--no-spark", *files],
            capture_output=True,
            text=True,
            timeout=60,
        )
        runs.append(time.monotonic() - began)
        assert result.returncode == 0, result.stdout + result.stderr
    figures = {"files": len(files), "runs_s": [round(r, 3) for r in runs], "median_s": round(sorted(runs)[2], 3)}
    REPORT.parent.mkdir(parents=True, exist_ok=True)
    REPORT.write_text(json.dumps(figures, indent=1))
    print(f"\nsluice validate --no-spark, {len(files)} examples: {figures}")
    assert figures["median_s"] < TARGET_S, figures
