"""Fetch jars and their runtime dependencies from Maven Central into the sluice cache."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence, Set
from pathlib import Path
from xml.sax.saxutils import escape

from .provision import ProvisionError, locked, require_tool, run

_POM = """<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>dev.sluice.cache</groupId>
  <artifactId>{name}</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

# Some POMs (Spark's) declare extra repositories that are unreachable here; route every one of them
# through Maven Central.
_SETTINGS = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors>
    <mirror>
      <id>central-only</id><mirrorOf>*</mirrorOf><url>https://repo.maven.apache.org/maven2</url>
    </mirror>
  </mirrors>
</settings>
"""

_DEPENDENCY = """    <dependency>
      <groupId>{group}</groupId><artifactId>{artifact}</artifactId><version>{version}</version>{exclusions}
    </dependency>"""

_EXCLUSION = "<exclusion><groupId>{group}</groupId><artifactId>{artifact}</artifactId></exclusion>"


def _split(coordinate: str, parts: int, shape: str) -> list[str]:
    split = coordinate.split(":")
    if len(split) != parts or not all(split):
        raise ValueError(f"maven coordinate must be {shape}, got {coordinate!r}")
    return [escape(part) for part in split]


def render_pom(name: str, coordinates: list[str], excluding: Sequence[str] = ()) -> str:
    """A throwaway POM whose runtime dependency closure is exactly what `coordinates` need, without the
    `excluding` artifacts (group:artifact) anywhere in it."""
    excluded = [_split(exclusion, 2, "group:artifact") for exclusion in excluding]
    exclusions = "".join(_EXCLUSION.format(group=group, artifact=artifact) for group, artifact in excluded)
    wrapped = f"\n      <exclusions>{exclusions}</exclusions>" if exclusions else ""
    deps = []
    for coordinate in coordinates:
        group, artifact, version = _split(coordinate, 3, "group:artifact:version")
        deps.append(_DEPENDENCY.format(group=group, artifact=artifact, version=version, exclusions=wrapped))
    return _POM.format(name=escape(name), dependencies="\n".join(deps))


def artifact_name(jar: str) -> str:
    """'kafka-clients-3.9.0.jar' -> 'kafka-clients' (Maven names jars artifactId-version.jar).

    Artifact ids may hold digits themselves ('spark-sql-kafka-0-10_2.13'), so the version is the first
    dash-separated part that starts like a dotted number, else a trailing bare number.
    """
    stem = jar.removesuffix(".jar")
    match = re.match(r"^(.+?)-(\d+\.\d+.*)$", stem) or re.match(r"^(.+)-(\d+)$", stem)
    return match.group(1) if match else stem


def fetch_jars(
    name: str,
    coordinates: list[str],
    dest: Path,
    *,
    skip_artifacts: Set[str] = frozenset(),
    excluding: Sequence[str] = (),
) -> list[Path]:
    """Resolve `coordinates` with Maven into `dest` once; later calls return the cached jars.

    `skip_artifacts` drops jars already provided elsewhere (e.g. by pyspark) so two versions of one
    library never share a classpath; `excluding` (group:artifact) keeps dependencies out of the resolution.
    """
    done = dest / ".complete"
    with locked(dest.parent / f".{dest.name}.lock"):
        if not done.exists():
            _resolve(name, coordinates, dest, skip_artifacts, excluding)
            done.write_text("\n".join(coordinates) + "\n")
    return sorted(dest.glob("*.jar"))


def _resolve(name: str, coordinates: list[str], dest: Path, skip_artifacts: Set[str], excluding: Sequence[str]) -> None:
    mvn = require_tool("mvn", "install Maven (apt-get install maven) to fetch jars from Maven Central")
    work = dest.parent / f".{dest.name}.build"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "pom.xml").write_text(render_pom(name, coordinates, excluding))
    (work / "settings.xml").write_text(_SETTINGS)
    log = dest.parent / f"{dest.name}.maven.log"
    try:
        run(
            [
                mvn,
                "-B",
                "-q",
                "-s",
                work / "settings.xml",
                "-f",
                work / "pom.xml",
                "dependency:copy-dependencies",
                "-DincludeScope=runtime",
                f"-DoutputDirectory={work / 'jars'}",
            ],
            what=f"fetching {', '.join(coordinates)} from Maven Central",
            hint="check that Maven Central is reachable (mvn -B dependency:get works)",
            log=log,
        )
    except ProvisionError as exc:
        missing = re.findall(r"Could not find artifact (\S+)", log.read_text(errors="replace"))
        if missing:
            raise ProvisionError(
                f"Maven Central does not serve {missing[-1]} (needed by {', '.join(coordinates)}); pin a version it has"
            ) from exc
        raise
    jars = [j for j in (work / "jars").glob("*.jar") if artifact_name(j.name) not in skip_artifacts]
    if not jars:
        raise ProvisionError(f"Maven resolved no jars for {coordinates}")
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    for jar in jars:
        jar.rename(dest / jar.name)
    shutil.rmtree(work, ignore_errors=True)
