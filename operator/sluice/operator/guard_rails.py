"""An administrator's guard rails: what apps may run, beyond what the StreamingApp model allows.

Whoever writes a StreamingApp chooses the image, the service account, sparkConf, `python:` steps and SQL,
which is running code (docs/security.md). The chart's `guardRails` values narrow that; the admission webhook
refuses an app that crosses one, and the reconciler marks an app accepted before a rail tightened
Valid=False (what runs keeps running). A pure function of the spec and the rails.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from sluice.api.app import StreamingAppSpec
from sluice.api.sqlcheck import called_functions
from sluice.api.validation import Problem, join_path, node_expressions

# Spark SQL functions that call any Java method of the driver's and executors' class path.
REFLECTION_FUNCTIONS = ("java_method", "reflect", "try_reflect")


def _names(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


@dataclass(frozen=True)
class GuardRails:
    allowed_images: tuple[str, ...] = ()  # prefixes; empty: any image
    allowed_service_accounts: tuple[str, ...] = ()  # empty: any (the operator's own <app>-spark is always allowed)
    python_steps: bool = True
    allowed_python_modules: tuple[str, ...] = ()  # packages or modules; empty: any
    forbidden_spark_conf: tuple[str, ...] = ()  # keys, or prefixes ending in "."
    refused_sql_functions: tuple[str, ...] = REFLECTION_FUNCTIONS

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GuardRails:
        env = dict(os.environ if env is None else env)
        return cls(
            allowed_images=_names(env.get("SLUICE_ALLOWED_IMAGES", "")),
            allowed_service_accounts=_names(env.get("SLUICE_ALLOWED_SERVICE_ACCOUNTS", "")),
            python_steps=env.get("SLUICE_PYTHON_STEPS", "true").lower() != "false",
            allowed_python_modules=_names(env.get("SLUICE_ALLOWED_PYTHON_MODULES", "")),
            forbidden_spark_conf=_names(env.get("SLUICE_FORBIDDEN_SPARK_CONF", "")),
            refused_sql_functions=tuple(
                name.lower() for name in _names(env.get("SLUICE_REFUSED_SQL_FUNCTIONS", ",".join(REFLECTION_FUNCTIONS)))
            ),
        )


def _within(module: str, allowed: str) -> bool:
    return module == allowed or module.startswith(f"{allowed}.")


def guard_rail_problems(spec: StreamingAppSpec, rails: GuardRails) -> list[Problem]:
    """Each rail the spec crosses, at the field that crosses it."""
    problems = []
    image = spec.spark.image  # None: the operator's default, which the administrator chose
    if image and rails.allowed_images and not any(image.startswith(prefix) for prefix in rails.allowed_images):
        allowed = ", ".join(rails.allowed_images)
        problems.append(Problem("spec.spark.image", f"{image!r} is not an allowed image (allowed: {allowed}…)"))
    account = spec.spark.serviceAccount
    if account and rails.allowed_service_accounts and account not in rails.allowed_service_accounts:
        allowed = ", ".join(rails.allowed_service_accounts)
        problems.append(Problem("spec.spark.serviceAccount", f"{account!r} is not an allowed account ({allowed})"))
    for key in sorted(spec.spark.sparkConf):
        if any(key == rule or (rule.endswith(".") and key.startswith(rule)) for rule in rails.forbidden_spark_conf):
            problems.append(Problem(f"spec.spark.sparkConf.{key}", "this setting is forbidden on this cluster"))
    for index, node in enumerate(spec.pipeline.nodes):
        if node.python is not None:
            module = node.python.function.split(":", 1)[0]
            where = join_path("spec.pipeline", "nodes", index, "python", "function")
            if not rails.python_steps:
                problems.append(Problem(where, "python steps are not allowed on this cluster"))
            elif rails.allowed_python_modules and not any(_within(module, m) for m in rails.allowed_python_modules):
                allowed = ", ".join(rails.allowed_python_modules)
                problems.append(Problem(where, f"module {module!r} is not allowed (allowed: {allowed})"))
        for path, expression in node_expressions(node):
            refused = sorted(called_functions(expression) & set(rails.refused_sql_functions))
            if refused:
                where = join_path("spec.pipeline", "nodes", index, *path)
                problems.append(Problem(where, f"calls {', '.join(refused)}, refused on this cluster"))
    return problems
