"""The `sluice` command's input and output, with kubectl's manners: files given as arguments or with `-f`,
directories and `-` (stdin), multi-document files whose other kinds are skipped by name, and `-o` for the
output's format."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import yaml

from sluice.api.validation import PipelineDocument, PipelineInvalid, Problem, load_documents, manifest_files

INPUT_HELP = "files, directories (their *.yaml, *.yml, *.json) or - for stdin"


class UsageError(Exception):
    """The command line cannot be carried out as given (exit 2)."""


def add_input(parser: argparse.ArgumentParser, what: str) -> None:
    """FILE… and -f FILE (as kubectl), both repeatable and combined."""
    parser.add_argument("files", nargs="*", metavar="FILE", help=f"{what}: {INPUT_HELP}")
    parser.add_argument(
        "-f", "--filename", dest="filenames", action="append", default=[], metavar="FILE", help="as FILE (kubectl's)"
    )


def add_output(parser: argparse.ArgumentParser, formats: tuple[str, ...]) -> None:
    parser.add_argument("-o", "--output", choices=formats, default=formats[0], help=f"default {formats[0]}")


def input_paths(args: argparse.Namespace) -> list[str]:
    """Every file the command line names, directories expanded; UsageError when it names none, or a directory holds
    no manifest (as kubectl refuses a directory with no objects)."""
    given = [*args.files, *args.filenames]
    if not given:
        raise UsageError("no input: give a file, a directory or - (stdin), as FILE or -f FILE")
    files = {path: manifest_files(path) for path in given}
    empty = [path for path, found in files.items() if not found]
    if empty:
        raise UsageError(f"no manifest (*.yaml, *.yml, *.json) in {', '.join(empty)}")
    return [file for found in files.values() for file in found]


def skipped_line(source: str, other_kind: str) -> str:
    """The line naming an object of another kind that a command leaves out."""
    return f"{source}: {other_kind}: skipped (not a StreamingApp)"


def say_skipped(document: PipelineDocument) -> bool:
    """Whether `document` is of another kind; if so, said on stderr, naming it."""
    if document.other_kind is None:
        return False
    print(skipped_line(document.source, document.other_kind), file=sys.stderr)
    return True


def one_app(args: argparse.Namespace) -> PipelineDocument:
    """The one StreamingApp (or bare pipeline) the input holds, other kinds skipped by name; PipelineInvalid when
    it holds none or several."""
    paths = input_paths(args)
    apps = [d for path in paths for d in load_documents(path) if not say_skipped(d)]
    where = ", ".join(paths)
    if not apps:
        raise PipelineInvalid([Problem(where, "no StreamingApp nor pipeline in it")])
    if len(apps) > 1:
        names = ", ".join(f"{d.app_name} ({d.source})" for d in apps)
        raise PipelineInvalid([Problem(where, f"holds {len(apps)} apps, {names}: this command takes one")])
    return apps[0]


def emit(data: Any, output: str) -> None:
    """`data` on stdout as JSON or YAML (`output`)."""
    if output == "json":
        print(json.dumps(data, indent=2))
    elif output == "yaml":
        print(yaml.safe_dump(data, sort_keys=False), end="")
    else:
        raise ValueError(f"emit: no format {output!r}")
