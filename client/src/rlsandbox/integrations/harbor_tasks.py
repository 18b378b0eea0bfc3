"""How rlsandbox names what it makes of a Harbor task folder: its task id and the tag of the image
built from its ``environment/``. Shared by ``rlsandbox tasks import-harbor`` (the daemon) and the
harbor adapter, which must find the image the importer built; importing this never imports harbor."""

from __future__ import annotations

import hashlib
import posixpath
import re
import tomllib
from pathlib import Path


def harbor_task_id(folder: Path, name: str = "") -> str:
    """A Harbor task's id: its ``[task] name`` (or the folder's name) made safe."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name or folder.name).strip("-") or folder.name


def harbor_image(folder: Path, task_id: str, prefix: str = "rlsandbox-harbor") -> str:
    """The tag ``rlsandbox tasks import-harbor --build`` gives the image built from a Harbor task
    folder's ``environment/``: the task's id and a digest of that folder's files."""
    environment = folder / "environment"
    digest = hashlib.sha256()
    for path in sorted(p for p in environment.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(environment)).encode() + b"\0" + path.read_bytes() + b"\0")
    safe = re.sub(r"[^a-z0-9_.-]+", "-", task_id.lower()).strip("-.") or "task"
    return f"{prefix}/{safe}:{digest.hexdigest()[:12]}"


def task_name(folder: Path) -> str:
    """The ``[task] name`` of a Harbor task folder's task.toml (empty when it has none)."""
    try:
        config = tomllib.loads((folder / "task.toml").read_text())
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return ""
    return str((config.get("task") or {}).get("name") or "")


def dockerfile_workdir(dockerfile: str) -> str:
    """The working directory a Dockerfile leaves its image in (its last ``WORKDIR``), or ""."""
    workdir = ""
    for line in dockerfile.splitlines():
        parts = line.strip().split(None, 1)
        if len(parts) == 2 and parts[0].upper() == "WORKDIR":
            value = parts[1].strip().strip('"')
            workdir = value if value.startswith("/") else posixpath.join(workdir or "/", value)
    return workdir
