"""Forking a session: ``count`` new sessions whose filesystem equals the source's at the call.

What a session changed is read by the engine or from its layers on the host, never by a process
in the (hostile) sandbox: the container's diff against its image (its overlay layer walked here,
runtime/overlay.py, else ``GET /containers/<id>/changes``) for the root filesystem, and its volumes
whole (a read-only-root pool's workspace is a volume). The changed places are taken as
a few tarballs through the engine's archive API (``plan_changes`` picks them: an added folder
whole, a workspace folder with many changes below it whole, otherwise each changed file), and each
fork, a sandbox of the same pool fresh from its warm pool, gets the deletions and then the
tarballs, extracted by the fork's own ``tar`` (read from a file dropped in the fork's host folder
where it has one). Measured against ``docker commit`` + create in
docs/BENCHMARKS.md ("Fork").

A session in which nothing has run since its hand-out needs no copy: its forks are new sessions
of its pool, or of its task as far as it has prefetched sandboxes ready (SessionManager.fork).

Not copied: processes and memory (a fork's processes are new: persistent shells start afresh),
tmpfs mounts (``/tmp`` on a read-only root: the engine cannot see into them), and the metadata of
a folder whose only change is its own mode or times.
"""

from __future__ import annotations

import asyncio
import io
import posixpath
import tarfile
from collections.abc import Iterable
from dataclasses import dataclass, field

from rlsandbox.daemon.agent.socket_transport import Drop
from rlsandbox.daemon.errors import FailedPrecondition, FileTooLarge
from rlsandbox.daemon.model import ExecRequest
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.sandbox import Sandbox

CHANGED, ADDED, DELETED = 0, 1, 2
# Places the engine or the daemon owns in every container: never copied, never deleted.
NOT_COPIED = ("/dev", "/proc", "/sys", "/etc/hostname", "/etc/hosts", "/etc/resolv.conf", "/.rlsandbox")
COLLAPSE = 0  # a changed folder of the workspace or scratch space with more changes than this below it is taken whole
NO_COLLAPSE = frozenset(
    {"/", "/usr", "/etc", "/var", "/lib", "/bin", "/sbin", "/opt", "/home", "/root", "/usr/lib", "/usr/local"}
)
DELETE_CHUNK = 500
# Besides the workspace, folders whose content in an image is nothing or next to nothing: taken
# whole when much changed in them (caches, scratch files), never file by file.
SCRATCH = ("/tmp", "/var/tmp", "/root", "/home")
MAX_COPIES = 4096  # tarballs one fork may take: a session that scattered more changes cannot be forked


@dataclass(slots=True)
class Snapshot:
    """The source's changes: one tarball to extract at ``root`` (``/`` when merged from several),
    paths to delete."""

    source: str
    tar: bytes = b""
    deletes: list[str] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)
    root: str = "/"

    @property
    def bytes(self) -> int:
        return len(self.tar)


def merge(archives: list[tuple[str, bytes]]) -> bytes:
    """One tarball rooted at ``/`` from the engine's archives, each of a path and named relative
    to its folder (``data/x`` for ``/workspace/data``; ``./x`` for ``/workspace/.``): every member
    renamed below its folder, hard links too. CPU work: run it in a thread."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as merged:
        for folder, data in archives:
            prefix = folder.strip("/")
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                for member in tar:
                    name = posixpath.normpath(posixpath.join(prefix, member.name)).lstrip("/")
                    if name in ("", ".") or name.startswith(".."):
                        continue  # the folder itself (it exists in the fork), or a name that leaves it
                    member.name = name
                    if member.islnk():
                        member.linkname = posixpath.normpath(posixpath.join(prefix, member.linkname)).lstrip("/")
                    merged.addfile(member, tar.extractfile(member) if member.isfile() else None)
    return out.getvalue()


def _under(path: str, places: Iterable[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in places)


def plan_changes(
    changes: list[tuple[str, int]], excluded: Iterable[str], collapsible: Iterable[str] = ()
) -> tuple[list[str], list[str]]:
    """(paths to copy, paths to delete) from the engine's diff. An added path is copied whole
    (everything below it is new); a changed file alone. A changed folder inside ``collapsible``
    (the workspace: the agent's project, bounded by the workspace limit) with more than COLLAPSE
    changes below it is copied whole, in one tarball; anywhere else (system folders: a pip
    install) its changes are copied one by one, never the unchanged content around them."""
    collapse_in = tuple(collapsible)
    skip = (*NOT_COPIED, *excluded)
    kinds = {p: k for p, k in changes if not _under(p, skip)}
    children: dict[str, list[str]] = {}
    for p in kinds:
        if p != "/":
            children.setdefault(posixpath.dirname(p), []).append(p)
    below: dict[str, int] = {}

    def count(p: str) -> int:
        if p not in below:
            below[p] = sum(1 + count(c) for c in children.get(p, ()))
        return below[p]

    copies: list[str] = []
    deletes: list[str] = []

    def walk(p: str) -> None:
        kind = kinds.get(p)
        if kind == DELETED:
            deletes.append(p)
            return
        if kind == ADDED:
            copies.append(p)  # new: everything below it is new too
            return
        if kind == CHANGED and not children.get(p):
            copies.append(p)  # a changed file (or a folder whose own metadata changed)
            return
        only = children.get(p, [])
        if kind == CHANGED and len(only) == 1 and kinds.get(only[0]) == CHANGED and children.get(only[0]):
            walk(only[0])  # a chain of folders down to where the changes are: the copy starts there
            return
        if kind == CHANGED and _under(p, collapse_in) and count(p) > COLLAPSE:
            copies.append(p)  # many changes below: the folder whole, in one tarball
            deletes.extend(d for d in _deleted_below(p, kinds))
            return
        for c in sorted(children.get(p, ())):
            walk(c)

    roots = sorted({p for p in kinds if posixpath.dirname(p) not in kinds or p == "/"})
    for r in roots:
        walk(r)
    return copies, deletes


def _deleted_below(folder: str, kinds: dict[str, int]) -> list[str]:
    """Deleted paths under a folder copied whole: the copy does not have them, but a fork's
    fresh sandbox (from the image) does, so they are deleted there first."""
    return [p for p, k in kinds.items() if k == DELETED and p.startswith(folder.rstrip("/") + "/")]


class Forker:
    """Takes a session's changes once and gives them to each fork (``max_bytes`` bounds them)."""

    def __init__(self, runtime: DockerRuntime, *, max_bytes: int, timeout: float = 120.0) -> None:
        self.runtime = runtime
        self.max_bytes = max_bytes
        self.timeout = timeout

    async def snapshot(self, sandbox: Sandbox, workdir: str) -> Snapshot:
        cid = sandbox.container_id
        info = await self.runtime.inspect(cid, timeout=self.timeout)
        mounts = info.get("Mounts") or []
        volumes = sorted(m["Destination"] for m in mounts if m.get("Type") == "volume")
        others = [m["Destination"] for m in mounts if m.get("Type") != "volume"]
        tmpfs = list((info.get("HostConfig") or {}).get("Tmpfs") or {})
        # The volumes do not depend on the diff (which costs the engine ~0.4 s on a big image): read
        # them while it is made. Each whole: a fork's own volume starts empty.
        volumes_read = asyncio.ensure_future(self._archives(cid, [(p, p.rstrip("/") + "/.") for p in volumes], self.max_bytes))
        try:
            try:
                changes = await self.runtime.changes(cid, timeout=self.timeout, info=info)
            except FileTooLarge:
                raise FailedPrecondition(
                    "the session changed too many paths to fork (its diff is over 16 MiB); fork earlier, "
                    "or keep the episode's files in the workspace"
                ) from None
            copies, deletes = plan_changes(changes, [*volumes, *others, *tmpfs], collapsible=[workdir, *SCRATCH])
            if len(copies) > MAX_COPIES:
                raise FailedPrecondition(
                    f"the session changed {len(copies)} separate places outside its workspace (at most {MAX_COPIES} can "
                    "be forked); fork earlier, or keep the episode's files in the workspace"
                )
            archives = await volumes_read
            left = self.max_bytes - sum(len(data) for _, data in archives)
            archives += await self._archives(cid, [(posixpath.dirname(p) or "/", p) for p in copies], left)
        finally:
            if not volumes_read.done():
                volumes_read.cancel()
            elif not volumes_read.cancelled():
                volumes_read.exception()  # retrieved: raised above, or not needed after another error
        snapshot = Snapshot(sandbox.name, deletes=deletes, roots=[*copies, *volumes])
        if len(archives) == 1 and archives[0][0] in ("/", workdir, *volumes):
            # One place, in a folder every fork has (the workspace): extracted there, nothing to rename.
            snapshot.root, snapshot.tar = archives[0]
        elif archives:
            snapshot.tar = await asyncio.to_thread(merge, archives)
        return snapshot

    async def _archives(self, cid: str, places: list[tuple[str, str]], left: int) -> list[tuple[str, bytes]]:
        """(folder, the engine's tarball of a path in it) for each place, ``left`` bytes in all."""
        archives: list[tuple[str, bytes]] = []
        try:
            for folder, path in places:
                archives.append((folder, await self.runtime.get_archive(cid, path, left, self.timeout)))
                left -= len(archives[-1][1])
        except FileTooLarge:
            raise FailedPrecondition(
                f"the session's changes are over the fork limit of {self.max_bytes >> 20} MiB as tarballs; "
                "fork earlier, or remove large files the episode does not need"
            ) from None
        return archives

    async def apply(self, snapshot: Snapshot, drop: Drop, sandbox: Sandbox) -> None:
        """Make a fresh sandbox's filesystem the source's: deletions, then the one tarball, which
        the fork's own ``tar`` extracts (a fresh sandbox: its tools are the image's, and nothing
        of the source's has run there). Without ``tar`` in the image, the engine extracts it."""
        for i in range(0, len(snapshot.deletes), DELETE_CHUNK):
            chunk = tuple(snapshot.deletes[i : i + DELETE_CHUNK])
            result = await sandbox.exec(ExecRequest(argv=("rm", "-rf", "--", *chunk), timeout=60.0))
            if result.exit_code != 0:
                raise FailedPrecondition(f"a fork could not delete what its source deleted: {result.stderr[:300]!r}")
        if not snapshot.tar:
            return
        result = await sandbox.untar(drop, snapshot.root, timeout=self.timeout)
        if result.exit_code in (126, 127):  # no tar in the image
            await self.runtime.put_archive(sandbox.container_id, snapshot.root, snapshot.tar, timeout=self.timeout)
        elif result.exit_code != 0:
            raise FailedPrecondition(f"a fork could not take its source's files: {result.stderr[:300]!r}")
