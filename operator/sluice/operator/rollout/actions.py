"""What the rollout state machine says: the actions to carry out ("ensure" requests: doing one twice is
harmless), the events to post, a refusal, and one step's result. Plain values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sluice.api.contract import QueryStep
from sluice.api.rollout import Refusal

from ..model import RolloutStatus


@dataclass(frozen=True)
class ApplyRevision:
    """Ensure the revision's pipeline ConfigMap exists (others are left alone)."""

    revision: str


@dataclass(frozen=True)
class StartDriver:
    """Ensure a SparkApplication `name` runs `revision`. standby: it starts and waits for Activate. The steps
    say which queries start on a new checkpoint (migrate, with the rewind and the output gate) or on the one the
    stable revision kept (restore); the others continue on their checkpoints."""

    name: str
    revision: str
    standby: bool
    steps: tuple[QueryStep, ...]


@dataclass(frozen=True)
class Activate:
    """The standby driver starts its queries."""

    driver: str


@dataclass(frozen=True)
class SwapQueries:
    """Inside the running driver: the steps' queries stop at a batch boundary and run `revision`'s plan
    (restart, migrate, start, stop, restore); `keep` queries are not touched."""

    driver: str
    revision: str
    steps: tuple[QueryStep, ...]


@dataclass(frozen=True)
class Drain:
    """Every query of the driver stops at a batch boundary; the driver stays up, idle, also after a restart."""

    driver: str


@dataclass(frozen=True)
class Resume:
    """A drained driver starts its queries again on their checkpoints. `revision` (the one it ran): it resumes on
    that revision's config as the rollout now places its checkpoints, the `restore` steps' queries taking their
    output back from the checkpoints a migration in the other driver made (None: on the config it ran)."""

    driver: str
    revision: str | None = None


@dataclass(frozen=True)
class DeleteDriver:
    driver: str


@dataclass(frozen=True)
class ReleaseRevision:
    """The rollout no longer needs the revision: its ConfigMap may go (unless a driver still mounts it), and so
    may these queries' checkpoints of that revision."""

    revision: str
    checkpoints: tuple[str, ...]
    # Checkpoint subfolders a checkpoint migration no longer needs: the ones its queries moved from (Complete),
    # or the ones it made (RolledBack). The app's driver deletes them (it refuses what it still needs).
    retired_folders: tuple[str, ...] = ()


def migrated_folder(query: str, revision: str) -> str:
    """The checkpoint subfolder a query migrated to `revision` runs on."""
    return f"{query}@{revision}"


def rollback_folder(query: str, revision: str, left: str) -> str:
    """The new checkpoint subfolder a rollback to `revision` moves a migrated query onto: `<query>@<revision>-<n>`,
    n one more than that of the folder it left (`left`) when that is one of these, else 1."""
    prefix = f"{query}@{revision}-"
    count = left.removeprefix(prefix)
    return f"{prefix}{int(count) + 1 if left.startswith(prefix) and count.isdigit() else 1}"


Action = ApplyRevision | StartDriver | Activate | SwapQueries | Drain | Resume | DeleteDriver | ReleaseRevision


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class Step:
    rollout: RolloutStatus | None
    stable_revision: str | None
    actions: tuple[Action, ...] = ()
    events: tuple[Event, ...] = ()
    refusal: Refusal | None = None
    waiting: str | None = None  # a newer revision waits for the rollout in progress
