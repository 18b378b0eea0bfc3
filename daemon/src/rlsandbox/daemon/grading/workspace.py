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

from rlsandbox.daemon.grading.shadowing import Shadowing
from rlsandbox.daemon.grading.task import TEST_FOLDER, matches, within

# The agent's commits are not part of its solution (history is reset at start), and a repository
# anywhere in the tree is configuration that tools would obey: no .git folder is ever copied.
IGNORED_PARTS = frozenset({".git"})


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


def snapshot_from_archive(data: bytes, exclude: list[str] | tuple[str, ...] = ()) -> Snapshot:
    """Parse the engine's tarball of a folder (members are prefixed with the folder's name),
    without the ``exclude``d paths (workspace-relative) and what is inside them."""
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
            if any(part in IGNORED_PARTS for part in rel.split("/")) or rel.startswith("../") or rel == "..":
                continue
            if exclude and within(rel, exclude):
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


def ancestor_of_any(path: str, paths: set[str]) -> bool:
    prefix = path + "/"
    return any(p.startswith(prefix) for p in paths)


def folders_holding_tests(base: Snapshot, test_files: list[str]) -> list[str]:
    """The folders that hold the task's test files, as glob patterns of their whole contents.

    A test file's folder belongs to the tests (its ``__init__.py``, conftest files, helpers and
    data) when it is named like a test folder, or when every Python file in it is a test file, an
    ``__init__.py`` or a conftest. A folder that also holds code under test stays the agent's; so
    does the workspace root.
    """
    folders: set[str] = set()
    py_by_folder: dict[str, list[str]] = {}
    for p, e in base.entries.items():
        if e.type == "file" and p.endswith(".py"):
            py_by_folder.setdefault(posixpath.dirname(p), []).append(p)
    for p, e in base.entries.items():
        if e.type != "file" or not matches(p, test_files):
            continue
        folder = posixpath.dirname(p)
        if not folder:
            continue
        named = bool(TEST_FOLDER.search(posixpath.basename(folder)))
        only_tests = all(
            matches(q, test_files) or posixpath.basename(q) in ("__init__.py", "conftest.py")
            for q in py_by_folder.get(folder, [])
        )
        if named or only_tests:
            folders.add(folder)
    return sorted(f"{f}/**" for f in folders if not any(f.startswith(g + "/") for g in folders))


def plan(
    base: Snapshot,
    agent: Snapshot,
    *,
    protected: list[str],
    test_files: list[str],
    hidden: list[str],
    shadow: Shadowing | None = None,
    kept: list[str] | tuple[str, ...] = (),
    commanded: frozenset[str] = frozenset(),
) -> Changes:
    """The agent's changes to ``base`` that the clean room applies.

    Dropped, and listed in ``discarded``: changes to protected files, to the original test files
    and to anything in the folders that hold them (``folders_holding_tests``); anything written at a hidden
    test's path; replacing a folder that holds protected files or hidden tests (by deleting it, or
    by a file or symlink in its place), which would remove them, or the ``kept`` paths (the
    workspace's excluded ones, in neither snapshot: the clean room's own); the ``commanded`` paths
    (what the test command runs as its program or runner script: ``command_files``); and, with
    ``shadow``, files that would run instead of the runner, its dependencies or a standard module.
    """
    test_globs = [*test_files, *folders_holding_tests(base, test_files)]
    guarded_patterns = [*protected, *test_globs]
    keep = {p for p in base.entries if matches(p, guarded_patterns)} | set(hidden) | set(kept)
    keep |= commanded & base.entries.keys()
    changes = Changes()

    def guarded(path: str) -> str | None:
        if path in hidden:
            return "hidden test path"
        if path in commanded:
            return "run by the test command"
        if matches(path, test_files):
            return "test file"
        if matches(path, test_globs):
            return "in a test folder"
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
        if why is None and entry.type != "dir" and ancestor_of_any(path, keep):
            why = "replaces a folder that holds tests or protected files"
        parent = posixpath.dirname(path)
        if why is None and parent and agent.entries.get(parent, Entry("dir", 0)).type != "dir":
            why = "inside something that is not a folder"
        if why is None and shadow is not None:
            why = shadow.why(path, entry.type, agent.entries, base.entries)
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
        if ancestor_of_any(path, keep):
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


def owned_tar(tar: bytes, uid: int, gid: int) -> bytes:
    """``tar`` with every member owned by ``uid:gid`` (the engine extracts members with the
    ownership their headers say), and the folders it only implies added as members too (the
    engine would make those root's): for pools whose commands run as an unprivileged user."""
    src = io.BytesIO(tar)
    out = io.BytesIO()
    seen: set[str] = set()
    with tarfile.open(fileobj=src, mode="r:*") as inp, tarfile.open(fileobj=out, mode="w") as dst:
        for member in inp:
            name = member.name.rstrip("/").removeprefix("./")
            parts = name.split("/")[:-1]
            for i in range(1, len(parts) + 1):
                folder = "/".join(parts[:i])
                if folder and folder not in seen:
                    seen.add(folder)
                    info = tarfile.TarInfo(folder)
                    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, uid, gid
                    dst.addfile(info)
            if member.isdir():
                seen.add(name)
            member.uid, member.gid, member.uname, member.gname = uid, gid, "", ""
            dst.addfile(member, inp.extractfile(member) if member.isreg() else None)
    return out.getvalue()
