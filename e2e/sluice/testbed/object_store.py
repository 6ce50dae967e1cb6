"""An S3-compatible object store: Versity's S3 gateway (versitygw, Apache-2.0) over a directory of the node.

The issue's example is SeaweedFS's S3 gateway; its Go module needs 494 others and a `replace` (so no plain
`go install`), where versitygw needs 81 and installs as it is. MinIO's server is AGPL. The gateway serves the
S3 API over its posix backend (a bucket is a directory, object metadata in extended attributes), checks AWS
Signature V4 against one root key pair and answers path-style requests (`http://host:port/bucket/key`, what
Hadoop's s3a does with fs.s3a.path.style.access). It runs on the host beside the node's other host processes,
on the node's address, so pods and the host reach it at one URL. The key pair is made per node and kept in the
node's state; apps get it as a Secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Collection, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .common import ManagedProcess, cache_dir, http_status, wait_until
from .kube import cached_binaries, go_install
from .versions import VERSITYGW

if TYPE_CHECKING:
    from pyarrow.fs import S3FileSystem

NAME = "object-store"
BINARY = "versitygw"
MODULE = "github.com/versity/versitygw"
BUCKET = "sluice"  # made at start: where checkpoints and tests write
REGION = "us-east-1"
HEALTH_PATH = "/health"
SECRET = "sluice-object-store"  # the Secret an app's pods read the key pair from (AWS SDK variable names)


def gateway_binary() -> Path:
    def build(out: Path, names: list[str]) -> None:
        go_install(BINARY, f"v{VERSITYGW}", f"{MODULE}/cmd/versitygw", ["-s", "-w"], out, out.parent / "build.log")

    return cached_binaries(cache_dir(BINARY, f"v{VERSITYGW}"), [BINARY], build)[BINARY]


@dataclass(frozen=True)
class ObjectStoreAccess:
    """Where the store answers and the key pair it accepts."""

    address: str
    port: int
    access_key: str
    secret_key: str
    bucket: str = BUCKET
    region: str = REGION

    @classmethod
    def new(cls, address: str, port: int) -> ObjectStoreAccess:
        return cls(address, port, access_key=secrets.token_hex(10).upper(), secret_key=secrets.token_urlsafe(30))

    @property
    def authority(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def endpoint(self) -> str:
        return f"http://{self.authority}"

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.touch(mode=0o600)
        path.write_text(json.dumps(asdict(self)) + "\n")

    @classmethod
    def load(cls, path: Path) -> ObjectStoreAccess:
        return cls(**json.loads(path.read_text()))

    def secret(self, namespace: str, name: str = SECRET) -> dict[str, Any]:
        """The key pair as a Secret, under the names every AWS SDK (and s3a's environment provider) reads."""
        return {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name, "namespace": namespace},
            "type": "Opaque",
            "stringData": {"AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key},
        }

    def chart_values(self) -> dict[str, Any]:
        """The chart's checkpoints values making this store the apps' default checkpoint store (a folder per
        namespace; the pods' key pair from the Secret `secret` makes in each apps' namespace)."""
        return {
            "location": f"s3a://{self.bucket}/{{namespace}}",
            "s3": {
                "endpoint": self.endpoint,
                "region": self.region,
                "pathStyleAccess": True,
                "credentialsSecret": SECRET,
            },
        }

    def filesystem(self, secret_key: str | None = None) -> S3FileSystem:
        """A pyarrow S3 client for the store, path-style (`secret_key`: another one, to be refused)."""
        from pyarrow.fs import S3FileSystem

        return S3FileSystem(
            access_key=self.access_key,
            secret_key=secret_key or self.secret_key,
            region=self.region,
            scheme="http",
            endpoint_override=self.authority,
            allow_bucket_creation=True,
            connect_timeout=5,
            request_timeout=10,
        )

    def healthy(self) -> bool:
        return http_status(f"{self.endpoint}{HEALTH_PATH}") == 200


def gateway_args(access: ObjectStoreAccess, data_dir: Path) -> list[str]:
    return [
        f"--port={access.address}:{access.port}",
        f"--region={access.region}",
        f"--health={HEALTH_PATH}",
        "--quiet",
        "posix",
        str(data_dir),
    ]


def gateway_env(access: ObjectStoreAccess) -> dict[str, str]:
    """The root key pair goes in the environment, not on the command line (which `ps` shows)."""
    return {**os.environ, "ROOT_ACCESS_KEY_ID": access.access_key, "ROOT_SECRET_ACCESS_KEY": access.secret_key}


def create_bucket(access: ObjectStoreAccess) -> None:
    """The bucket, through the S3 API (the gateway records its owner and ACL with it)."""
    from pyarrow.fs import FileType

    store = access.filesystem()
    if store.get_file_info(access.bucket).type == FileType.NotFound:
        store.create_dir(access.bucket)


@contextlib.contextmanager
def serving(address: str, port: int, data_dir: Path, timeout: float = 60) -> Iterator[ObjectStoreAccess]:
    """The gateway as a child process on address:port over data_dir, with a new key pair and the bucket;
    stopped on exit (a cluster without a node of the test bed's own, e.g. kind, runs it so)."""
    access = ObjectStoreAccess.new(address, port)
    data_dir.mkdir(parents=True, exist_ok=True)
    command = [str(gateway_binary()), *gateway_args(access, data_dir)]
    process = ManagedProcess(NAME, command, data_dir.parent / f"{NAME}.log", env=gateway_env(access)).start()
    try:
        wait_until(access.healthy, timeout=timeout, what=f"the object store at {access.endpoint}", process=process)
        create_bucket(access)
        yield access
    finally:
        process.stop()


def restored_name(relative: str, renames: dict[str, str]) -> str:
    """A file's path inside an app's checkpoint folder, with its first part (the query's folder) renamed as
    `renames` says: a query that ran on `<query>@<revision>` is restored under `<query>`, where a new app reads."""
    folder, _, rest = relative.partition("/")
    return f"{renames.get(folder, folder)}/{rest}" if rest else renames.get(folder, folder)


def copy_folder(
    store: S3FileSystem,
    source: str,
    target: str,
    renames: dict[str, str] | None = None,
    leave_out: Collection[str] = (),
) -> int:
    """Every object under `source` copied under `target` (server-side), each query folder renamed as `renames`
    says (restored_name) and the folders in `leave_out` left out; what `aws s3 sync` does in the backup page.
    Two folders that would land in one are refused. The number of objects copied."""
    from pyarrow.fs import FileSelector, FileType

    renames = renames or {}
    files = [info for info in store.get_file_info(FileSelector(source, recursive=True)) if info.type == FileType.File]
    relative = [info.path.removeprefix(source + "/") for info in files]
    kept = [(info, path) for info, path in zip(files, relative, strict=True) if path.split("/")[0] not in leave_out]
    landing: dict[str, set[str]] = {}
    for _, path in kept:
        folder = path.split("/")[0]
        landing.setdefault(restored_name(folder, renames), set()).add(folder)
    merged = {into: sorted(folders) for into, folders in landing.items() if len(folders) > 1}
    if merged:
        raise ValueError(f"folders that would be copied into one: {merged}")
    for info, path in kept:
        store.copy_file(info.path, f"{target}/{restored_name(path, renames)}")
    return len(kept)


def delete_folder(store: S3FileSystem, folder: str) -> None:
    """Every object under `folder`, then its directory markers deepest first: the gateway's posix backend refuses
    a marker of a directory that still holds something, and pyarrow's delete_dir sends them all in one request."""
    from pyarrow.fs import FileSelector, FileType

    found = store.get_file_info(FileSelector(folder, recursive=True))
    for info in found:
        if info.type == FileType.File:
            store.delete_file(info.path)
    for info in sorted(found, key=lambda i: i.path.count("/"), reverse=True):
        if info.type == FileType.Directory:
            store.delete_dir(info.path)
    if store.get_file_info(folder).type != FileType.NotFound:
        store.delete_dir(folder)
