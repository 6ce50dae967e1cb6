"""The operator's image has no Spark: every module of sluice.operator (and sluice.api, which it imports) imports
with pyspark and py4j absent, and none of them brings in the runner (sluice.pipelines). The import contracts in
pyproject.toml say the same statically; this proves it in a process."""

from __future__ import annotations

import subprocess
import sys
import textwrap

IMPORT_ALL = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    class NoSpark(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("pyspark", "py4j"):
                raise ImportError(f"{name} is not installed (the operator's image has no Spark)")
            return None

    sys.meta_path.insert(0, NoSpark())
    import sluice.api, sluice.operator
    imported = []
    for package in (sluice.api, sluice.operator):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if module.name != "sluice.operator.__main__":
                importlib.import_module(module.name)
                imported.append(module.name)
    runner = sorted(m for m in sys.modules if m.startswith(("sluice.pipelines", "pyspark", "py4j")))
    print(len(imported), runner)
    """
)


def test_the_operator_imports_without_spark() -> None:
    result = subprocess.run([sys.executable, "-c", IMPORT_ALL], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-3000:]
    count, runner = result.stdout.split(" ", 1)
    assert int(count) > 20, result.stdout  # every module was walked, not an empty package
    assert runner.strip() == "[]", f"the operator brought in {runner.strip()}"
