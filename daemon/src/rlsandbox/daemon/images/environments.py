"""Task environments: an image per (repository, environment) with the packages a project's tests
need, for dataset records whose own image cannot be had (no registry here, or none published).

The packages are resolved on the host, with the host's own pip and its index settings (`pip
download` of wheels for the image's interpreter and platform), and installed in the image from
those files with no index: the sandbox never needs the network, and the build needs none but the
host's. The image is named by its content (the base image's id and every wheel's digest), so the
same environment is built once and found again; its labels record what it holds.
"""

from __future__ import annotations

import hashlib
import io
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from rlsandbox.daemon.errors import FailedPrecondition, InvalidArgument
from rlsandbox.daemon.runtime.docker import DockerRuntime

LABEL_ENV_HASH = "rlsandbox.env-hash"
LABEL_ENV_PACKAGES = "rlsandbox.env-packages"
ENV_BUILDER_VERSION = "1"  # bump to rebuild every environment after a change to how they are made
DEFAULT_BASE = "rlsandbox/python-task:latest"
WHEELS_IN_IMAGE = "/tmp/rlsandbox-wheels"
# The image's pip is the wheel's own (run from the zip): images need no pip, and the installer is
# the one resolved with the rest.
INSTALL = (
    f'python3 "$(ls {WHEELS_IN_IMAGE}/pip-*.whl)/pip" install --no-index --no-deps --no-cache-dir '
    f"--break-system-packages --root-user-action=ignore --disable-pip-version-check "
    f"$(ls {WHEELS_IN_IMAGE}/*.whl | grep -v '/pip-[0-9]') && rm -rf {WHEELS_IN_IMAGE}"
)


@dataclass(frozen=True, slots=True)
class Environment:
    """A built (or found) environment image."""

    tag: str
    env_hash: str
    packages: tuple[str, ...]  # the wheels it holds, by file name
    built: bool  # False: it was there already


def repository_slug(repo: str) -> str:
    """``marshmallow-code/marshmallow`` -> ``marshmallow-code__marshmallow`` (an image name part)."""
    slug = re.sub(r"[^a-z0-9._-]+", "_", repo.lower().replace("/", "__")).strip("._-")
    return slug[:100] or "task"


def environment_hash(base_id: str, wheels: Sequence[Path]) -> str:
    """The content of an environment: the base image and every wheel, by digest."""
    h = hashlib.sha256(f"rlsandbox-env {ENV_BUILDER_VERSION}\n{base_id}\n".encode())
    for wheel in sorted(wheels, key=lambda p: p.name):
        h.update(f"{wheel.name} {hashlib.sha256(wheel.read_bytes()).hexdigest()}\n".encode())
    return h.hexdigest()


def dockerfile(base: str) -> str:
    return f"FROM {base}\nCOPY wheels {WHEELS_IN_IMAGE}\nRUN {INSTALL}\n"


def download_argv(
    requirements: Sequence[str], dest: Path, *, python: str, platform: str, wheelhouse: Path | None, offline: bool
) -> list[str]:
    """``pip download`` of binary wheels for the image's interpreter (``python``, e.g. ``3.11``)
    and platform, pip itself among them; from the host's index, or with ``offline`` only from
    ``wheelhouse`` (a folder of wheels fetched before)."""
    argv = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check", "--only-binary", ":all:"]
    argv += ["--python-version", python, "--implementation", "cp", "--platform", platform, "--dest", str(dest)]
    if wheelhouse is not None:
        argv += ["--find-links", str(wheelhouse)]
    if offline:
        argv += ["--no-index"]
    return [*argv, "pip", *requirements]


def download(
    requirements: Sequence[str], dest: Path, *, python: str, platform: str, wheelhouse: Path | None, offline: bool
) -> list[Path]:
    """The wheels of ``requirements`` (resolved with their dependencies) in ``dest``."""
    for req in requirements:
        if not req.strip() or req.lstrip().startswith("-"):
            raise InvalidArgument(f"requirement {req!r}: a package specifier (name, name==1.2, name>=1), not an option")
    argv = download_argv(requirements, dest, python=python, platform=platform, wheelhouse=wheelhouse, offline=offline)
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode != 0:
        tail = "\n".join(line for line in done.stderr.splitlines() if not line.startswith("WARNING"))[-1500:]
        where = f"only the wheels in {wheelhouse}" if offline else "the host's package index"
        raise FailedPrecondition(f"resolving {' '.join(requirements)} for Python {python} from {where} failed:\n{tail}")
    return sorted(dest.glob("*.whl"))


async def build_environment(
    runtime: DockerRuntime,
    repo: str,
    requirements: Sequence[str],
    *,
    base: str = DEFAULT_BASE,
    python: str = "3.11",
    platform: str = "manylinux2014_x86_64",
    wheelhouse: Path | None = None,
    offline: bool = False,
    prefix: str = "rlsandbox-env",
) -> Environment:
    """The environment image of ``repo`` with ``requirements`` on ``base``: built, or found by its
    content hash. Raises FailedPrecondition when the base is missing or the packages cannot be had."""
    config = await runtime.images.config(base)
    base_id = await runtime.images.image_id(base)
    if config is None or base_id is None:
        raise FailedPrecondition(f"the base image {base} is not on this engine: build it (rlsandbox images build)")
    with tempfile.TemporaryDirectory(prefix="rlsandbox-env-") as tmp:
        wheels = download(
            requirements, Path(tmp), python=python, platform=platform, wheelhouse=wheelhouse, offline=offline
        )  # fmt: skip
        env_hash = environment_hash(base_id, wheels)
        tag = f"{prefix}/{repository_slug(repo)}:{env_hash[:16]}"
        packages = tuple(w.name for w in wheels)
        found = await runtime.images.labels(tag)
        if found is not None and found.get(LABEL_ENV_HASH) == env_hash:
            return Environment(tag, env_hash, packages, built=False)
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            text = dockerfile(base).encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(text)
            tar.addfile(info, io.BytesIO(text))
            for wheel in wheels:
                tar.add(wheel, arcname=f"wheels/{wheel.name}")
        labels = {LABEL_ENV_HASH: env_hash, LABEL_ENV_PACKAGES: " ".join(packages), "rlsandbox.task-image": "environment"}
        await runtime.images.build(context.getvalue(), tag=tag, labels=labels)
    return Environment(tag, env_hash, packages, built=True)
