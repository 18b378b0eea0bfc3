"""Moving files between the trainer's machine and a sandbox, for the adapters whose frameworks
upload and download (rLLM, harbor): a tar through a command's stdin in, a tar on a command's stdout
out. What comes out was made by the sandbox and is untrusted: only regular files are written, only
inside the target folder."""

from __future__ import annotations

import io
import os
import tarfile
from pathlib import Path
from typing import List, Tuple

from rlsandbox.client import ExecResult

MAX_TRANSFER = 64 << 20  # bytes of one upload or download: the node's stdin and output caps


def upload(local_path: str | Path, remote_path: str) -> Tuple[List[str], bytes]:
    """The command (and its stdin) that puts a local file or directory tree at ``remote_path``,
    creating its parents; modes and symlinks are kept."""
    remote = remote_path.rstrip("/") or "/"
    parent, leaf = os.path.split(remote)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        tar.add(str(local_path), arcname=leaf or ".")
    data = buf.getvalue()
    if len(data) > MAX_TRANSFER:
        raise ValueError(f"{local_path} is {len(data)} bytes as a tar: more than {MAX_TRANSFER} in one upload; split it")
    return ["sh", "-c", 'mkdir -p "$1" && tar -x -o -f - -C "$1"', "upload", parent or "/"], data


def download(remote_dir: str) -> List[str]:
    """The command that writes a tar of ``remote_dir``'s contents to stdout."""
    return ["tar", "-c", "-f", "-", "-C", remote_dir, "."]


def downloaded(result: ExecResult, remote_dir: str, dest: str | Path) -> List[str]:
    """Writes what :func:`download` sent (a successful result) under ``dest``."""
    if result.stdout_truncated:
        raise ValueError(f"{remote_dir} is more than {MAX_TRANSFER} bytes as a tar: too large for one download")
    return extract_regular_files(result.stdout, Path(dest))


def extract_regular_files(data: bytes, dest: Path) -> List[str]:
    """Writes the regular files of an untrusted tar under ``dest``; anything else (links, devices,
    absolute paths or paths through ``..``) is skipped. Returns the files written."""
    dest = dest.resolve()
    written: List[str] = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        for member in tar:
            if not member.isfile():
                continue
            parts = Path(member.name).parts
            if not parts or Path(member.name).is_absolute() or ".." in parts:
                continue
            target = dest.joinpath(*[p for p in parts if p != "."])
            if target == dest:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            for folder in [target.parent, *target.parent.parents]:
                if folder == dest:
                    break
                if folder.is_symlink():
                    raise ValueError(f"{folder} is a symlink: refusing to write through it")
            source = tar.extractfile(member)
            if source is None:
                continue
            if target.is_symlink():
                target.unlink()
            with open(target, "wb") as out:
                out.write(source.read())
            os.chmod(target, member.mode & 0o755)
            written.append(str(target))
    return written
