"""Container images built locally, without a registry or an image builder: OCI archives for containerd.

The node's sandbox (pause) image and the test images are single-layer images holding one static binary
built here (C for pause, Go for probe). `oci_archive` packs files or a whole root filesystem (e.g. a
debootstrap tree) into an OCI image-layout tar that `ctr images import` understands; the full image name
goes into the index annotation containerd reads, since a bare tag there makes it import nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .common import REPO_ROOT, ProvisionError, cache_dir, locked, require_tool, run
from .kube import go_binary, go_env

TOOLCHAIN = REPO_ROOT / "e2e" / "toolchain"
PAUSE_SOURCE = TOOLCHAIN / "pause" / "pause.c"
PROBE_MODULE = TOOLCHAIN / "probe"

# What containerd 1.6's CRI plugin and kubelet v1.34 expect as the sandbox image; built here, never pulled.
PAUSE_IMAGE = "registry.k8s.io/pause:3.10"
PROBE_IMAGE = "sluice.local/probe:1"

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
CONTAINERD_NAME = "io.containerd.image.name"
OCI_REF_NAME = "org.opencontainers.image.ref.name"


@dataclass(frozen=True)
class ImageSpec:
    """An image to pack: `files` maps in-image paths to host files; `rootfs` adds a whole tree at /."""

    name: str
    entrypoint: Sequence[str]
    files: Mapping[str, Path] = field(default_factory=dict)
    rootfs: Path | None = None
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    user: str = "0"


# --- OCI image layout ------------------------------------------------------------------------------

def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Reproducible entries: no timestamps, no host user names."""
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def _layer(spec: ImageSpec) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if spec.rootfs is not None:
            for path in sorted(spec.rootfs.rglob("*")):
                tar.add(path, arcname=str(path.relative_to(spec.rootfs)), recursive=False, filter=_normalised)
        parents: set[str] = set()
        for target, source in sorted(spec.files.items()):
            parts = Path(target.lstrip("/")).parts
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in parents and spec.rootfs is None:
                    parents.add(directory)
                    entry = tarfile.TarInfo(directory)
                    entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(entry)
            info = _normalised(tar.gettarinfo(source, arcname="/".join(parts)))
            info.uid = info.gid = 0
            with open(source, "rb") as handle:
                tar.addfile(info, handle)
    return buffer.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, object]:
    digest = _digest(data)
    info = tarfile.TarInfo("blobs/sha256/" + digest.removeprefix("sha256:"))
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def oci_archive(spec: ImageSpec, out: Path) -> Path:
    """Write spec as a single-layer linux/amd64 OCI image-layout tar at out."""
    layer = _layer(spec)
    config = {"architecture": "amd64", "os": "linux",
              "config": {"Entrypoint": list(spec.entrypoint), "Env": list(spec.env), "User": spec.user},
              "rootfs": {"type": "layers", "diff_ids": [_digest(layer)]},
              "history": [{"created_by": "sluice.testbed.images"}]}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
        manifest = {"schemaVersion": 2, "mediaType": OCI_MANIFEST,
                    "config": _blob(tar, _json(config), OCI_CONFIG),
                    "layers": [_blob(tar, layer, OCI_LAYER)]}
        descriptor = {**_blob(tar, _json(manifest), OCI_MANIFEST),
                      "platform": {"architecture": "amd64", "os": "linux"},
                      "annotations": {CONTAINERD_NAME: spec.name, OCI_REF_NAME: spec.name}}
        for name, data in (("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
                           ("index.json", _json({"schemaVersion": 2, "manifests": [descriptor]}))):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    partial.replace(out)
    return out


# --- the binaries inside ---------------------------------------------------------------------------

def _source_key(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        for file in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
            digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def _cached_build(name: str, sources: Path, build: callable) -> Path:  # type: ignore[valid-type]
    """cache/images/<name>-<source hash>/<name>, built once by build(out, log) under a lock."""
    root = cache_dir("images", f"{name}-{_source_key(sources)}")
    binary = root / name
    if not binary.is_file():
        with locked(root / ".lock"):
            if not binary.is_file():
                partial = root / f"{name}.partial"
                build(partial, root / "build.log")
                partial.replace(binary)
    return binary


def pause_binary() -> Path:
    """A static pause built from e2e/toolchain/pause with the host's C compiler."""
    def build(out: Path, log: Path) -> None:
        cc = shutil.which("cc") or require_tool("gcc", "install a C compiler (apt-get install gcc libc6-dev)")
        run([cc, "-Os", "-static", "-s", "-o", out, PAUSE_SOURCE], what="compiling the pause binary",
            hint="needs a C compiler with static libc (apt-get install gcc libc6-dev)", log=log)

    return _cached_build("pause", PAUSE_SOURCE, build)


def probe_binary() -> Path:
    """The static Go test program from e2e/toolchain/probe (no dependencies beyond the standard library)."""
    def build(out: Path, log: Path) -> None:
        run([go_binary(), "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, "."],
            what="building the probe test binary", hint="needs Go", log=log, cwd=PROBE_MODULE, env=go_env())

    return _cached_build("probe", PROBE_MODULE, build)


def pause_image() -> ImageSpec:
    return ImageSpec(PAUSE_IMAGE, ["/pause"], {"/pause": pause_binary()}, user="65535:65535")


def probe_image() -> ImageSpec:
    return ImageSpec(PROBE_IMAGE, ["/probe"], {"/probe": probe_binary()})


def image_archive(spec: ImageSpec) -> Path:
    """spec packed once into the cache (keyed by its content), ready for import."""
    layer_key = hashlib.sha256(_layer(spec)).hexdigest()[:16]
    safe = spec.name.replace("/", "_").replace(":", "_")
    out = cache_dir("images") / f"{safe}-{layer_key}.oci.tar"
    if not out.is_file():
        with locked(out.with_suffix(".lock")):
            if not out.is_file():
                oci_archive(spec, out)
    if not out.is_file():
        raise ProvisionError(f"could not write the image archive {out}")
    return out
