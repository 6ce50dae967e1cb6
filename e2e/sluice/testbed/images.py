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
import subprocess
import tarfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .common import REPO_ROOT, cache_dir, locked, require_tool, run
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
    cmd: Sequence[str] = ()


# --- OCI image layout ------------------------------------------------------------------------------


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _normalised(info: tarfile.TarInfo) -> tarfile.TarInfo:
    """Reproducible entries: no timestamps, no host user names."""
    info.mtime = 0
    info.uname = info.gname = ""
    return info


def _write_layer(spec: ImageSpec, out: Path) -> str:
    """The image's only layer as an uncompressed tar at out; returns its digest (also its diff_id)."""
    with tarfile.open(out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        if spec.rootfs is not None:
            for path in sorted(spec.rootfs.rglob("*")):
                relative = path.relative_to(spec.rootfs)
                if relative.parts[0] in ("dev", "proc", "sys") and len(relative.parts) > 1:
                    continue  # the runtime provides these; device nodes do not belong in an image
                tar.add(path, arcname=str(relative), recursive=False, filter=_normalised)
        directories: set[str] = set()
        for target, source in sorted(spec.files.items()):
            parts = Path(target.lstrip("/")).parts
            for depth in range(1, len(parts)):
                directory = "/".join(parts[:depth])
                if directory not in directories and spec.rootfs is None:
                    directories.add(directory)
                    entry = tarfile.TarInfo(directory)
                    entry.type, entry.mode = tarfile.DIRTYPE, 0o755
                    tar.addfile(entry)
            info = _normalised(tar.gettarinfo(source, arcname="/".join(parts)))
            info.uid = info.gid = 0
            with open(source, "rb") as handle:
                tar.addfile(info, handle)
    digest = hashlib.sha256()
    with open(out, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return "sha256:" + digest.hexdigest()


def _blob(tar: tarfile.TarFile, data: bytes | Path, media_type: str, digest: str | None = None) -> dict[str, object]:
    """Add a blob (bytes, or a file whose digest is given) under blobs/sha256/; returns its descriptor."""
    if isinstance(data, Path):
        assert digest is not None
        info = tar.gettarinfo(data, arcname="blobs/sha256/" + digest.removeprefix("sha256:"))
        _normalised(info)
        with open(data, "rb") as handle:
            tar.addfile(info, handle)
        return {"mediaType": media_type, "digest": digest, "size": info.size}
    digest = _digest(data)
    info = tarfile.TarInfo("blobs/sha256/" + digest.removeprefix("sha256:"))
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True).encode()


def oci_archive(spec: ImageSpec, out: Path) -> Path:
    """Write spec as a single-layer linux/amd64 OCI image-layout tar at out."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial, layer = out.with_name(out.name + ".partial"), out.with_name(out.name + ".layer")
    try:
        layer_digest = _write_layer(spec, layer)
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Entrypoint": list(spec.entrypoint),
                "Cmd": list(spec.cmd),
                "Env": list(spec.env),
                "User": spec.user,
            },
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
            "history": [{"created_by": "sluice.testbed.images"}],
        }
        with tarfile.open(partial, "w", format=tarfile.PAX_FORMAT) as tar:
            manifest = {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": _blob(tar, _json(config), OCI_CONFIG),
                "layers": [_blob(tar, layer, OCI_LAYER, layer_digest)],
            }
            descriptor = {
                **_blob(tar, _json(manifest), OCI_MANIFEST),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {CONTAINERD_NAME: spec.name, OCI_REF_NAME: spec.name},
            }
            for name, data in (
                ("oci-layout", _json({"imageLayoutVersion": "1.0.0"})),
                ("index.json", _json({"schemaVersion": 2, "manifests": [descriptor]})),
            ):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        partial.replace(out)
    finally:
        layer.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return out


def full_name(name: str) -> str:
    """The name the kubelet asks containerd for: sluice/spark:1 is docker.io/sluice/spark:1."""
    first = name.split("/", 1)[0]
    if "/" not in name:
        return f"docker.io/library/{name}"
    return name if "." in first or ":" in first or first == "localhost" else f"docker.io/{name}"


def archive_names(archive: Path) -> list[str]:
    """The image names an OCI archive's index gives containerd."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        index = json.load(member) if member else {}
    return [m.get("annotations", {}).get(CONTAINERD_NAME, "") for m in index.get("manifests", [])]


# --- the binaries inside ---------------------------------------------------------------------------


def _source_key(*paths: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        for file in sorted(p for p in ([path] if path.is_file() else path.rglob("*")) if p.is_file()):
            digest.update(file.name.encode() + file.read_bytes())
    return digest.hexdigest()[:16]


def _cached_build(name: str, sources: Path, build: Callable[[Path, Path], None]) -> Path:
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
        run(
            [cc, "-Os", "-static", "-s", "-o", out, PAUSE_SOURCE],
            what="compiling the pause binary",
            hint="needs a C compiler with static libc (apt-get install gcc libc6-dev)",
            log=log,
        )

    return _cached_build("pause", PAUSE_SOURCE, build)


def probe_binary() -> Path:
    """The static Go test program from e2e/toolchain/probe (no dependencies beyond the standard library)."""

    def build(out: Path, log: Path) -> None:
        run(
            [go_binary(), "build", "-trimpath", "-buildvcs=false", "-ldflags=-s -w", "-o", out, "."],
            what="building the probe test binary",
            hint="needs Go",
            log=log,
            cwd=PROBE_MODULE,
            env=go_env(),
        )

    return _cached_build("probe", PROBE_MODULE, build)


def pause_image() -> ImageSpec:
    return ImageSpec(PAUSE_IMAGE, ["/pause"], {"/pause": pause_binary()}, user="65535:65535")


def probe_image() -> ImageSpec:
    return ImageSpec(PROBE_IMAGE, ["/probe"], {"/probe": probe_binary()})


def spec_key(spec: ImageSpec) -> str:
    """A cache key for a files-only spec: its name, settings and the content of its files."""
    digest = hashlib.sha256(_json([spec.name, list(spec.entrypoint), list(spec.cmd), list(spec.env), spec.user]))
    for target, source in sorted(spec.files.items()):
        digest.update(target.encode() + source.read_bytes())
    return digest.hexdigest()[:16]


def image_archive(spec: ImageSpec, key: str | None = None) -> Path:
    """spec packed once into the cache, ready for import; a rootfs spec needs a key naming its content."""
    if key is None:
        if spec.rootfs is not None:
            raise ValueError("an image with a rootfs needs an explicit cache key")
        key = spec_key(spec)
    safe = spec.name.replace("/", "_").replace(":", "_")
    out = cache_dir("images") / f"{safe}-{key}.oci.tar"
    if not out.is_file():
        with locked(out.with_suffix(".lock")):
            if not out.is_file():
                oci_archive(spec, out)
    return out


# --- a Debian base image ---------------------------------------------------------------------------

BASE_IMAGE = "sluice.local/debian-base:bookworm"
BASE_SUITE = "bookworm"
BASE_PACKAGES = ("python3", "python3-venv", "openjdk-17-jre-headless", "ca-certificates", "tini", "procps")
TRIM = ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man", "usr/share/info")


def debian_mirror(sources: Path = Path("/etc/apt")) -> str | None:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources), or None for debootstrap's."""
    for path in sorted(sources.glob("sources.list.d/*.sources")):
        for stanza in path.read_text().split("\n\n"):
            fields = {
                key.strip(): value.split()
                for line in stanza.splitlines()
                if ":" in line and not line.startswith("#")
                for key, value in [line.split(":", 1)]
            }
            if BASE_SUITE in fields.get("Suites", []) and fields.get("URIs"):
                return fields["URIs"][0]
    for path in [sources / "sources.list", *sorted(sources.glob("sources.list.d/*.list"))]:
        for line in path.read_text().splitlines() if path.is_file() else []:
            words = line.split()
            if len(words) >= 3 and words[0] == "deb" and BASE_SUITE in words:
                return next(word for word in words[1:] if "://" in word)
    return None


def base_rootfs(packages: Sequence[str] = BASE_PACKAGES) -> Path:
    """A trimmed Debian minbase tree with packages, made once by debootstrap (needs root)."""
    key = hashlib.sha256(_json([BASE_SUITE, sorted(packages)])).hexdigest()[:16]
    root = cache_dir("images", f"debian-base-{key}")
    rootfs = root / "rootfs"
    if not (root / "done").is_file():
        with locked(root / ".lock"):
            if not (root / "done").is_file():
                _debootstrap(rootfs, packages, root / "debootstrap.log")
                (root / "done").write_text(key)
    return rootfs


def _debootstrap(rootfs: Path, packages: Sequence[str], log: Path) -> None:
    debootstrap = require_tool("debootstrap", "apt-get install debootstrap")
    _unmount_under(rootfs)
    shutil.rmtree(rootfs, ignore_errors=True)
    mirror = debian_mirror()
    try:
        run(
            [
                debootstrap,
                "--variant=minbase",
                f"--include={','.join(packages)}",
                BASE_SUITE,
                rootfs,
                *([mirror] if mirror else []),
            ],
            what=f"debootstrap of Debian {BASE_SUITE}",
            hint="needs root and Debian's package mirror",
            log=log,
        )
    finally:
        _unmount_under(rootfs)  # debootstrap mounts /proc and /sys inside; a failure can leave them
    for relative in TRIM:
        for entry in (rootfs / relative).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


def _unmount_under(root: Path) -> None:
    prefix = str(root.resolve()) + "/"
    points = [line.split()[4] for line in Path("/proc/self/mountinfo").read_text().splitlines()]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


def base_image(packages: Sequence[str] = BASE_PACKAGES) -> tuple[ImageSpec, str]:
    """The Debian base image (JRE + Python) and its cache key, for image_archive(spec, key)."""
    rootfs = base_rootfs(packages)
    key = (rootfs.parent / "done").read_text().strip()
    return ImageSpec(BASE_IMAGE, [], rootfs=rootfs, cmd=["/bin/bash"]), key
