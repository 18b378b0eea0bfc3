"""Workspace snapshots and the changes between two of them: pure functions over tarballs.

A snapshot is read by the Docker engine from the container's filesystem (``GET .../archive``), so
no program of the agent can alter what the grader sees. ``diff`` is binary-safe and covers new,
changed (content, mode, type) and deleted files, folders and symlinks. ``plan`` then drops what the
agent may not change (protected files, the tests) and says so, and ``changes_tar`` packs the rest
for the clean room.
"""

from __future__ import annotations

import io
import posixpath
import tarfile
from dataclasses import dataclass, field

from rlsandbox.daemon.grading.task import matches

IGNORED_TOP = (".git",)  # the agent's commits are not part of its solution; history is reset at start


@dataclass(frozen=True, slots=True)
class Entry:
    type: str  # "file", "dir", "symlink"
    mode: int
    data: bytes = b""
    target: str = ""  # symlink target

    def same(self, other: Entry) -> bool:
        return (
            self.type == other.type
            and self.data == other.data
            and self.target == other.target
            and (self.type == "dir" or (self.mode & 0o777) == (other.mode & 0o777))
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    entries: dict[str, Entry]
    skipped: tuple[str, ...] = ()  # devices, fifos and sockets are not part of a workspace


def snapshot_from_archive(data: bytes) -> Snapshot:
    """Parse the engine's tarball of a folder (members are prefixed with the folder's name)."""
    entries: dict[str, Entry] = {}
    skipped: list[str] = []
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = tar.getmembers()
        if not members:
            return Snapshot({})
        prefix = members[0].name.split("/")[0]
        for m in members:
            name = m.name
            if name == prefix:
                continue
            rel = name[len(prefix) + 1 :] if name.startswith(prefix + "/") else name
            rel = posixpath.normpath(rel)
            if rel.split("/")[0] in IGNORED_TOP or rel.startswith("../") or rel == "..":
                continue
            if m.isdir():
                entries[rel] = Entry("dir", m.mode)
            elif m.issym():
                entries[rel] = Entry("symlink", m.mode, target=m.linkname)
            elif m.isfile() or m.islnk():
                f = tar.extractfile(m)
                entries[rel] = Entry("file", m.mode, f.read() if f else b"")
            else:
                skipped.append(rel)
    return Snapshot(entries, tuple(skipped))


@dataclass(slots=True)
class Changes:
    """What the clean room applies: paths to delete first, then entries to write, in order."""

    deletes: list[str] = field(default_factory=list)
    writes: dict[str, Entry] = field(default_factory=dict)
    discarded: list[str] = field(default_factory=list)  # "path: why", for the result and alerts

    @property
    def empty(self) -> bool:
        return not self.deletes and not self.writes


def _ancestor_of_any(path: str, paths: set[str]) -> bool:
    prefix = path + "/"
    return any(p.startswith(prefix) for p in paths)


def plan(base: Snapshot, agent: Snapshot, *, protected: list[str], test_files: list[str], hidden: list[str]) -> Changes:
    """The agent's changes to ``base`` that the clean room applies.

    Dropped, and listed in ``discarded``: changes to protected files and to the original test files;
    anything written at a hidden test's path; and replacing a folder that holds protected files or
    hidden tests (by deleting it, or by a file or symlink in its place), which would remove them.
    """
    guarded_patterns = [*protected, *test_files]
    keep = {p for p in base.entries if matches(p, guarded_patterns)} | set(hidden)
    changes = Changes()

    def guarded(path: str) -> str | None:
        if path in hidden:
            return "hidden test path"
        if matches(path, test_files):
            return "test file"
        if matches(path, protected):
            return "protected file"
        return None

    for path, entry in sorted(agent.entries.items()):
        old = base.entries.get(path)
        if old is not None and old.same(entry):
            continue
        if old is not None and old.type == "dir" and entry.type == "dir":
            continue  # a folder's mode change is not worth a write
        why = guarded(path)
        if why is None and entry.type != "dir" and _ancestor_of_any(path, keep):
            why = "replaces a folder that holds tests or protected files"
        parent = posixpath.dirname(path)
        if why is None and parent and agent.entries.get(parent, Entry("dir", 0)).type != "dir":
            why = "inside something that is not a folder"
        if why is not None:
            changes.discarded.append(f"{path}: {'added' if old is None else 'changed'} ({why}; discarded)")
            continue
        if old is not None and old.type != entry.type:
            changes.deletes.append(path)
        changes.writes[path] = entry

    deleted = sorted(p for p in base.entries if p not in agent.entries)  # parents sort before children
    deleted_set = set(deleted)
    kept_dirs: set[str] = set()  # deleted folders that hold guarded files: their other contents go one by one
    for path in deleted:
        parent = posixpath.dirname(path)
        if parent in deleted_set and parent not in kept_dirs:
            continue  # removed with its folder
        why = guarded(path)
        if why is not None:
            changes.discarded.append(f"{path}: deleted ({why}; discarded)")
            continue
        if _ancestor_of_any(path, keep):
            kept_dirs.add(path)
            continue
        changes.deletes.append(path)
    return changes


def changes_tar(writes: dict[str, Entry], extra_files: dict[str, bytes] | None = None) -> bytes:
    """A tarball of ``writes`` (folders first, then files and symlinks) and then ``extra_files``
    (hidden tests), relative to the workspace, with the parent folders of every member."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        added: set[str] = set()

        def ensure_parents(path: str) -> None:
            parts = path.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                d = "/".join(parts[:i])
                if d not in added and d not in writes:
                    added.add(d)
                    info = tarfile.TarInfo(d)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)

        for path, entry in sorted(writes.items(), key=lambda kv: (kv[1].type != "dir", kv[0])):
            ensure_parents(path)
            info = tarfile.TarInfo(path)
            info.mode = entry.mode & 0o7777
            if entry.type == "dir":
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif entry.type == "symlink":
                info.type = tarfile.SYMTYPE
                info.linkname = entry.target
                tar.addfile(info)
            else:
                info.size = len(entry.data)
                tar.addfile(info, io.BytesIO(entry.data))
            added.add(path)
        for path, data in sorted((extra_files or {}).items()):
            ensure_parents(path)
            info = tarfile.TarInfo(path)
            info.mode = 0o644
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()
