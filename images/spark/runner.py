"""Entry point of sluice drivers: spark-submit runs this file (local:///opt/sluice/runner.py)."""

import sys

from sluice.pipelines.runner import main

sys.exit(main())
