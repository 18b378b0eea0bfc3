"""How rlsandbox names what it makes of a Harbor task folder: its task id and the tag of the image
built from its ``environment/``. Shared by ``rlsandbox tasks import-harbor`` (the daemon) and the
harbor adapter, which must find the image the importer built; importing this never imports harbor."""

from __future__ import annotations

import hashlib
import json
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


_TASK_FILES: dict[tuple[str, int, int], dict[str, dict[str, object]]] = {}  # (path, mtime, size) -> id -> spec


def task_from_file(path: str | Path, task_id: str) -> dict[str, object]:
    """The spec of ``task_id`` in a JSONL file of ``rlsandbox tasks import-harbor --out``: one file
    serves every trial of a harbor job (read once per version of the file)."""
    where = Path(path)
    try:
        st = where.stat()
    except OSError as e:
        raise FileNotFoundError(
            f"{where}: the tasks file is not readable ({e.strerror}): make it with "
            "'rlsandbox tasks import-harbor TASKS_DIR --build --out FILE'"
        ) from e
    key = (str(where.resolve()), st.st_mtime_ns, st.st_size)
    specs = _TASK_FILES.get(key)
    if specs is None:
        specs = {}
        with where.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    spec = json.loads(line)
                except json.JSONDecodeError as e:
                    raise ValueError(f"{where}:{number}: not a JSON task spec ({e.msg})") from e
                if not isinstance(spec, dict) or not isinstance(spec.get("id"), str):
                    raise ValueError(f"{where}:{number}: a task spec needs an 'id'")
                specs[spec["id"]] = spec
        _TASK_FILES.clear()  # one file per process at a time, in practice: keep only the newest
        _TASK_FILES[key] = specs
    found = specs.get(task_id)
    if found is None:
        raise LookupError(
            f"task {task_id!r} is not in {where} ({len(specs)} tasks): import its folder with "
            "'rlsandbox tasks import-harbor' into that file"
        )
    return found
