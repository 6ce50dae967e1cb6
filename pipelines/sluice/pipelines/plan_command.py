"""`sluice plan NEW.yaml [--from OLD.yaml]`: what applying a changed StreamingApp would do, before it is applied.

Per query: keep, restart (a hot swap, or on a new driver), migrate (a new checkpoint), start, stop; the strategy
`auto` picks, or the refusal of the one the spec states, and what each strategy would do instead. It runs
sluice.api.rollout, the code the operator plans its rollouts with. Against the cluster, the base is what the
operator diffs with: the spec kept in the stable revision's ConfigMap, read with kubectl (so a kubeconfig,
context and auth plugins work as for kubectl; also `kubectl sluice plan`).

Exit codes as `kubectl diff`: 0 no change, 1 changes (a refusal included), 2 error.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from typing import Any

from sluice.api.app import StreamingAppSpec, parsed_manifest, revision
from sluice.api.contract import REVISION_SPEC_FILE, revision_configmap_name
from sluice.api.rollout import ChangePlan, plan_change, runs_like
from sluice.api.sqlcheck import static_ddl_parser, static_sql_parser
from sluice.api.validation import PipelineDocument, PipelineInvalid, load_documents, manifest_files

from .cli_io import add_input, add_output, emit, input_paths, say_skipped
from .kubectl import KubectlError, add_cluster_flags, kubectl_json

NO_CHANGE, CHANGES, ERROR = 0, 1, 2
TERMINAL_PHASES = ("Complete", "RolledBack", "Failed")


class PlanError(Exception):
    """What stops a plan, said for the user (the file, the app, the field)."""


@dataclass(frozen=True)
class Base:
    spec: StreamingAppSpec
    against: str  # what the change is compared with, said for the user
    notes: tuple[str, ...] = ()
    tried: str | None = None  # the revision whose rollout just rolled back or failed: not tried again as it is


@dataclass
class PlanResult:
    app: str
    namespace: str | None
    against: str
    plan: ChangePlan
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "app": self.app,
            "namespace": self.namespace,
            "against": self.against,
            "notes": self.notes,
            **self.plan.as_dict(),
        }


def add_plan_parser(sub: Any) -> None:
    p = sub.add_parser(
        "plan",
        help="what applying a changed app would do to the running one: per query, the strategy, refusals "
        "(exit 0 no change, 1 changes, 2 error)",
    )
    add_input(p, "the changed apps")
    p.add_argument("--from", dest="base", help="compare with this file's app of the same name, not the cluster's")
    add_cluster_flags(p)
    add_output(p, ("text", "json", "yaml"))
    p.set_defaults(func=cmd_plan)


def cmd_plan(args: argparse.Namespace) -> int:
    results: list[PlanResult] = []
    errors = 0
    for path in input_paths(args):
        try:
            documents = load_documents(path)
        except (OSError, PipelineInvalid) as exc:
            print(f"error: {path}: {exc}", file=sys.stderr)
            errors += 1
            continue
        for document in documents:
            try:
                result = plan_document(document, args)
            except (PlanError, KubectlError) as exc:
                print(f"error: {path}: {exc}", file=sys.stderr)
                errors += 1
                continue
            if result is not None:
                results.append(result)
    print_results(results, args.output)
    if errors:
        return ERROR
    return CHANGES if any(r.plan.changes for r in results) else NO_CHANGE


def plan_document(document: PipelineDocument, args: argparse.Namespace) -> PlanResult | None:
    if say_skipped(document):
        return None
    if document.manifest is None:
        raise PlanError("a bare pipeline: plan compares StreamingApp manifests (kind: StreamingApp)")
    name = document.app_name
    new = parsed_spec(document.manifest, f"{name} in {document.source}")
    namespace = (document.manifest.get("metadata") or {}).get("namespace") or args.namespace
    base = file_base(args.base, name) if args.base else cluster_base(name, namespace, args)
    runs = runs_like(new, base.spec)
    if base.tried is not None and revision(runs) == base.tried:
        note = f"revision {base.tried} is the one whose rollout just ended without it: it is not rolled out again"
        return PlanResult(name, namespace, base.against, plan_change(base.spec, base.spec), [*base.notes, note])
    return PlanResult(name, namespace, base.against, plan_change(base.spec, runs), [*base.notes])


def parsed_spec(manifest: dict[str, Any], where: str) -> StreamingAppSpec:
    spec, problems = parsed_manifest(manifest, sql=static_sql_parser, ddl=static_ddl_parser)
    if spec is None:
        raise PlanError(f"{where} is not valid:\n" + "\n".join(f"  {p}" for p in problems))
    return spec


def file_base(path: str, name: str) -> Base:
    try:
        documents = [d for f in manifest_files(path) for d in load_documents(f)]
        apps = [d for d in documents if d.manifest is not None and d.other_kind is None]
    except (OSError, PipelineInvalid) as exc:
        raise PlanError(f"--from {path}: {exc}") from exc
    named = [d for d in apps if d.app_name == name] or (apps if len(apps) == 1 else [])  # StreamingApps only
    if not named:
        raise PlanError(f"--from {path} holds no StreamingApp named {name}")
    return Base(parsed_spec(named[0].manifest or {}, f"{name} in {path}"), f"{path}")


def cluster_base(name: str, namespace: str | None, args: argparse.Namespace) -> Base:
    """The spec the operator's next rollout diffs with, as it kept it (rollout.plan.diff_base: the stable
    revision's, or a failed rollout's target), and what the app's status says about changes applied now."""
    without = "compare with a file (--from OLD.yaml)"
    app = kubectl_json(args, namespace, "get", "streamingapp", name, without=without)
    status = app.get("status") or {}
    rollout = status.get("rollout") or {}
    failed = rollout.get("phase") == "Failed"
    base_revision = (
        (rollout.get("toRevision") if failed else None) or status.get("stableRevision") or status.get("revision")
    )
    if not base_revision:
        raise PlanError(f"streamingapp/{name} has no running revision yet: there is nothing to compare with")
    configmap = kubectl_json(
        args, namespace, "get", "configmap", revision_configmap_name(name, base_revision), without=without
    )
    text = (configmap.get("data") or {}).get(REVISION_SPEC_FILE)
    if not text:
        raise PlanError(f"configmap/{revision_configmap_name(name, base_revision)} keeps no {REVISION_SPEC_FILE}")
    spec = StreamingAppSpec.model_validate_json(text)
    notes = []
    if rollout and rollout.get("phase") not in TERMINAL_PHASES:
        notes.append(
            f"a rollout to revision {rollout.get('toRevision')} is {rollout.get('phase')}: a change applied now "
            "rolls out after it ends"
        )
    if status.get("phase") not in (None, "Running"):
        notes.append(f"the app is {status['phase']}: a driver that is starting runs the new revision as it starts")
    where = f"{namespace}/" if namespace else ""
    tried = rollout.get("toRevision") if rollout.get("phase") in ("RolledBack", "Failed") else None
    return Base(spec, f"revision {base_revision} of streamingapp {where}{name}", tuple(notes), tried)


def print_results(results: list[PlanResult], output: str) -> None:
    if output == "text":
        print("\n\n".join(text_of(r) for r in results))
    else:
        emit([r.as_dict() for r in results], output)


def text_of(result: PlanResult) -> str:
    plan = result.plan
    lines = [f"{result.app}: compared with {result.against}", *(f"note: {n}" for n in result.notes)]
    if plan.refusal:
        lines.append(f"refused (updateStrategy.type {plan.requested}): {plan.refusal}")
    elif plan.resubmit:
        lines.append(
            "no rollout (the revision stays): spark-operator resubmits the driver with the new settings, a restart "
            "on the same checkpoints"
        )
    elif plan.strategy is None:
        lines.append("no rollout: nothing the driver runs changes")
    else:
        picked = "picked by auto" if plan.requested == "auto" else "as the spec states"
        lines.append(f"strategy: {plan.strategy} ({picked}){', a new driver' if plan.new_driver else ''}")
    if plan.rollout:
        width = max(len(q.name) for q in plan.queries) if plan.queries else 0
        lines.append("queries:")
        for query in plan.queries:
            rewind = f" (rewind {query.rewind_ms} ms)" if query.action == "migrate" and query.rewind_ms else ""
            lines.append(f"  {query.name:<{width}}  {query.action}{rewind}")
            lines += [f"  {'':<{width}}    {reason}" for reason in query.reasons]
    lines += [f"runtime: {reason}" for reason in plan.runtime]
    if plan.unaffected:
        lines.append(f"applied without a rollout: {', '.join(plan.unaffected)}")
    if plan.options:
        lines.append("each strategy:")
        for option in plan.options:
            verdict = ("safe" + (", a new driver" if option.new_driver else "")) if option.safe else "refused"
            lines.append(f"  {option.strategy:<19}  {verdict}")
    return "\n".join(lines)
