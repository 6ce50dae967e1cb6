"""Benchmarks run only when asked for by marker (`make bench` = `pytest -m bench pipelines/bench`).

pytest's testpaths leave this folder out of `make test`; this guard also skips the benchmarks when the
folder is named explicitly without `-m bench` (e.g. `pytest pipelines/bench`), since one run takes
many minutes. (`-m "not bench"` deselects them as usual.)
"""

from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "bench" in (config.getoption("markexpr") or ""):
        return
    skip = pytest.mark.skip(reason="benchmark: run it with `make bench` (pytest -m bench pipelines/bench)")
    for item in items:
        if item.get_closest_marker("bench") is not None:
            item.add_marker(skip)
