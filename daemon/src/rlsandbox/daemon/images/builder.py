"""Builds the sandbox images of ``sandbox_images/images.toml`` from Debian packages.

No registry is involved: root filesystems come from mmdebstrap (or the host's busybox-static) and
are imported; Dockerfile images build on top of them. Every image carries the hash of its inputs
as a label, and a build whose hash matches the existing image is skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import logging
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field
from rlsandbox.daemon.errors import FailedPrecondition
from rlsandbox.daemon.runtime.docker import DockerRuntime

log = logging.getLogger(__name__)

LABEL_INPUT_HASH = "rlsandbox.input-hash"
LABEL_IMAGE_NAME = "rlsandbox.image"
BUILDER_VERSION = "1"  # bump to rebuild everything after a change to how images are made
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class ImageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["busybox", "rootfs", "dockerfile"]
    tag: str
    suite: str = "bookworm"
    variant: str = "minbase"
    packages: list[str] = Field(default_factory=list)
    base: str | None = None
    context: str | None = None


class ImagesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    images: dict[str, ImageSpec]


@dataclass(frozen=True, slots=True)
class BuildOutcome:
    name: str
    tag: str
    input_hash: str
    built: bool  # False: skipped, the image was up to date
    seconds: float


def default_images_dir() -> Path:
    """``sandbox_images/`` of the source checkout (or ``$RLSANDBOX_IMAGES_DIR``)."""
    env = os.environ.get("RLSANDBOX_IMAGES_DIR")
    if env:
        return Path(env)
    here = Path(__file__).resolve()
    for parent in here.parents:
        candidate = parent / "sandbox_images" / "images.toml"
        if candidate.exists():
            return candidate.parent
    raise FailedPrecondition("cannot find sandbox_images/images.toml; set RLSANDBOX_IMAGES_DIR")


def load_images(images_dir: Path) -> dict[str, ImageSpec]:
    with open(images_dir / "images.toml", "rb") as f:
        return ImagesFile.model_validate(tomllib.load(f)).images


def build_order(specs: dict[str, ImageSpec], wanted: list[str] | None) -> list[str]:
    """Names to build, bases before the images on top of them."""
    order: list[str] = []

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if name not in specs:
            raise FailedPrecondition(f"unknown image {name!r}; images.toml defines {', '.join(sorted(specs))}")
        if name in trail:
            raise FailedPrecondition(f"image bases form a cycle: {' -> '.join((*trail, name))}")
        base = specs[name].base
        if base:
            visit(base, (*trail, name))
        if name not in order:
            order.append(name)

    for name in wanted or list(specs):
        visit(name, ())
    return order


def _hash_tree(path: Path, h: hashlib._Hash) -> None:
    for file in sorted(p for p in path.rglob("*") if p.is_file()):
        h.update(str(file.relative_to(path)).encode() + b"\0")
        h.update(file.read_bytes())


def input_hash(name: str, spec: ImageSpec, images_dir: Path, base_hash: str | None) -> str:
    h = hashlib.sha256()
    h.update(orjson.dumps({"builder": BUILDER_VERSION, "name": name, "spec": spec.model_dump()}))
    if base_hash:
        h.update(base_hash.encode())
    if spec.kind == "busybox":
        h.update(Path(_busybox_path()).read_bytes())
    if spec.context:
        _hash_tree(images_dir / spec.context, h)
    return h.hexdigest()[:32]


def _busybox_path() -> str:
    path = shutil.which("busybox")
    if path is None:
        raise FailedPrecondition("busybox is not installed: apt-get install -y busybox-static")
    return path


def _busybox_rootfs(target: Path) -> None:
    """A tar of a minimal root filesystem: busybox-static with its applets as symlinks."""
    busybox = _busybox_path()
    applets = subprocess.run([busybox, "--list"], capture_output=True, check=True, text=True).stdout.split()
    with tarfile.open(target, "w") as tar:
        for d, mode in (("bin", 0o755), ("tmp", 0o1777), ("etc", 0o755), ("workspace", 0o755), ("root", 0o700)):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = mode
            tar.addfile(info)
        tar.add(busybox, arcname="bin/busybox")
        for applet in applets:
            if applet == "busybox":
                continue
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type = tarfile.SYMTYPE
            info.linkname = "busybox"
            tar.addfile(info)
        for name, text in (("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), ("etc/group", "root:x:0:\n")):
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))


def _context_tar(context: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for file in sorted(context.rglob("*")):
            tar.add(file, arcname=str(file.relative_to(context)), recursive=False)
    return buf.getvalue()


class ImageBuilder:
    """Builds images in dependency order, skipping the ones whose inputs did not change."""

    def __init__(
        self,
        runtime: DockerRuntime,
        images_dir: Path,
        *,
        progress: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.runtime = runtime
        self.images_dir = images_dir
        self.specs = load_images(images_dir)
        self.progress = progress

    async def build(self, names: list[str] | None = None, *, force: bool = False) -> list[BuildOutcome]:
        hashes: dict[str, str] = {}
        outcomes = []
        for name in build_order(self.specs, names):
            spec = self.specs[name]
            digest = input_hash(name, spec, self.images_dir, hashes.get(spec.base) if spec.base else None)
            hashes[name] = digest
            started = time.monotonic()
            labels = await self.runtime.images.labels(spec.tag)
            if not force and labels is not None and labels.get(LABEL_INPUT_HASH) == digest:
                self.progress(f"{name}: up to date ({spec.tag}, inputs {digest[:12]})")
                outcomes.append(BuildOutcome(name, spec.tag, digest, False, time.monotonic() - started))
                continue
            self.progress(f"{name}: building {spec.tag} ({spec.kind}, inputs {digest[:12]})")
            await self._build_one(name, spec, digest)
            seconds = time.monotonic() - started
            self.progress(f"{name}: built in {seconds:.1f} s")
            outcomes.append(BuildOutcome(name, spec.tag, digest, True, seconds))
        return outcomes

    async def _build_one(self, name: str, spec: ImageSpec, digest: str) -> None:
        changes = [
            f"LABEL {LABEL_INPUT_HASH}={digest}",
            f"LABEL {LABEL_IMAGE_NAME}={name}",
            f"ENV PATH={DEFAULT_PATH}",
            "WORKDIR /workspace" if spec.kind == "busybox" else "WORKDIR /",
            'CMD ["/bin/sh"]',
        ]
        if spec.kind == "dockerfile":
            assert spec.context is not None and spec.base is not None
            context = _context_tar(self.images_dir / spec.context)
            base_tag = self.specs[spec.base].tag
            # The base is passed as a build arg through the Dockerfile's ARG BASE.
            tag_params = {LABEL_INPUT_HASH: digest, LABEL_IMAGE_NAME: name}
            await self.runtime.images.build(context, tag=spec.tag, labels=tag_params, buildargs={"BASE": base_tag})
            return
        with tempfile.TemporaryDirectory(prefix=f"rlsandbox-image-{name}-") as tmp:
            rootfs = Path(tmp) / "rootfs.tar"
            if spec.kind == "busybox":
                await asyncio.to_thread(_busybox_rootfs, rootfs)
            else:
                await self._mmdebstrap(spec, rootfs)
            await self.runtime.images.import_rootfs(rootfs, tag=spec.tag, changes=changes)

    async def _mmdebstrap(self, spec: ImageSpec, target: Path) -> None:
        if shutil.which("mmdebstrap") is None:
            raise FailedPrecondition("mmdebstrap is not installed: apt-get install -y mmdebstrap")
        argv = [
            "mmdebstrap",
            "--quiet",
            f"--variant={spec.variant}",
            f"--include={','.join(spec.packages)}",
            # Keep images lean: no docs, man pages or apt lists in the layer.
            "--dpkgopt=path-exclude=/usr/share/man/*",
            "--dpkgopt=path-exclude=/usr/share/doc/*",
            "--dpkgopt=path-include=/usr/share/doc/*/copyright",
            '--customize-hook=rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin',
            '--customize-hook=mkdir -p "$1"/workspace',
            spec.suite,
            str(target),
        ]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await proc.communicate()
        if proc.returncode != 0:
            tail = output.decode("utf-8", "replace")[-2000:]
            raise FailedPrecondition(f"mmdebstrap of {spec.suite} failed (exit {proc.returncode}):\n{tail}")
