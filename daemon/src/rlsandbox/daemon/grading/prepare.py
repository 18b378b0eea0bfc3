"""Task workspaces in sandboxes: the workspace put in place (owned by the sandbox's user where
commands do not run as root), the git history reset to one commit, the task's setup run; and
workspaces moved in and out as tarballs, by the sandbox's own ``tar`` where nothing of an episode
can reach it, by the engine otherwise.

An engine archive call costs ~55 ms of dockerd's CPU (it re-executes itself to chroot into the
container), the sandbox's ``tar`` a few ms: five of them per graded episode were a third of the
node's CPU (docs/BENCHMARKS.md, "Graded episodes").
"""

from __future__ import annotations

import asyncio
import collections
import io
import posixpath
import shlex
import tarfile
from collections.abc import Mapping, Sequence

from rlsandbox.daemon.agent.socket_transport import Drop
from rlsandbox.daemon.errors import ContainerNotFound, FailedPrecondition, FileTooLarge
from rlsandbox.daemon.grading.room import TaskSetupFailed
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.grading.workspace import ancestor_of_any, owned_tar
from rlsandbox.daemon.model import ExecRequest, ExecResult
from rlsandbox.daemon.pool import WarmPool
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.sandbox import Sandbox

STEP_TIMEOUT = 60.0
OWNED_CACHE = 4  # task workspaces (32 MB at most each) kept re-owned for a recycling pool's user
# Task workspaces as their git reset left them (.git included), per image and owner: the next
# session of the task extracts this instead of running `git init/add/commit` again (15 ms of CPU
# for a small task; hashing and compressing every file for a big one).
TASK_CACHE_BYTES = 256 << 20  # all of them, by default (DaemonConfig.task_cache_bytes)
BASED_MAX_BYTES = 64 << 20  # task tars past it are not kept (nor hashed)
BASED_ENTRIES = 4096
# The sandbox's own tar: the image's, found on the system folders only (an episode may write
# elsewhere), with no options from the environment.
TAR_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TAR_OPTIONS": "", "LC_ALL": "C"}
NO_TAR = (126, 127)  # the image has no tar: the engine does it
# Entries of a folder on the way to an excluded path read one by one (an engine call each, ~55 ms
# of dockerd's CPU), at most: past it, one read of the whole folder. A policy that fills its
# workspace root with files multiplies a grade's engine calls by this much, no more.
READ_AROUND_ENTRIES = 64
# No background "git maintenance run --auto" after the commit: nothing to maintain in a one-commit
# history (it showed in the CPU samples of a node preparing tasks).
GIT_IDENTITY = (
    "-c", "user.name=rlsandbox", "-c", "user.email=rlsandbox@localhost", "-c", "commit.gpgsign=false",
    "-c", "maintenance.auto=false", "-c", "gc.auto=0",
)  # fmt: skip


# The base commit's dates are fixed: every session of a task (and every fork of a fresh one) has
# the same HEAD, whenever it was prepared.
GIT_DATES = {"GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}


class _TooMany(Exception):
    """A folder on the way to an excluded path has more entries than are worth reading one by one."""


class ReadTimedOut(FailedPrecondition):
    """A workspace took longer than STEP_TIMEOUT to read (its contents decide how long: a policy
    that fills its workspace with millions of files must score, not be masked as infra)."""


class Workspaces:
    def __init__(self, runtime: DockerRuntime, pools: Mapping[str, WarmPool], *, based_budget: int = TASK_CACHE_BYTES) -> None:
        self.runtime = runtime
        self.pools = pools
        # Task workspaces re-owned for a pool's user, by (uid, gid, size, hash): every session of a
        # task (and every clean room, every prefetched sandbox) would otherwise re-pack the same tar.
        self._owned: collections.OrderedDict[tuple[int, int, int, int], tuple[bytes, bytes]] = collections.OrderedDict()
        # Reset workspaces by (image, owner, path, size, hash of the task's tar): (task tar, reset
        # tar or b"" when too big to keep, whether it has a git index).
        self._based: collections.OrderedDict[tuple[object, ...], tuple[bytes, bytes, bool]] = collections.OrderedDict()
        self._based_bytes = 0
        self._making: dict[tuple[object, ...], asyncio.Future[None]] = {}
        self.based_budget = based_budget  # bytes; 0: every session resets git itself
        self.based_hits = 0

    def owner(self, sandbox: Sandbox) -> tuple[int, int] | None:
        """(uid, gid) the sandbox's commands run as, when not root (recycling pools)."""
        pool = self.pools.get(sandbox.pool)
        run_as = pool.spec.container.run_as if pool is not None else ""
        if not run_as:
            return None
        uid, _, gid = run_as.partition(":")
        return int(uid), int(gid or uid)

    def trusted(self, sandbox: Sandbox, *, fresh: bool) -> bool:
        """Whether a command the sandbox's agent runs is out of every episode's reach: nothing of
        an episode has run there yet (``fresh``: a sandbox being prepared, a clean room before the
        agent's files are in), or the episode's commands run as another user than the agent's, on
        a read-only root (recycling pools: they can neither change the image's tools nor signal
        or trace the agent's processes; docs/RELIABILITY.md)."""
        return fresh or self.owner(sandbox) is not None

    async def read(
        self,
        sandbox: Sandbox,
        path: str,
        max_bytes: int,
        *,
        fresh: bool,
        timeout: float = STEP_TIMEOUT,
        exclude: Sequence[str] = (),
    ) -> bytes:
        """The folder ``path`` as a tarball, members under the folder's own name (the engine's
        layout), read by the sandbox's ``tar`` running as the agent's user where ``trusted``, by
        the engine otherwise; without the ``exclude``d paths (relative to ``path``: a virtualenv
        inside the repository), as far as the reader can leave them out (``snapshot_from_archive``
        drops whatever of them is still there). Raises FileTooLarge past ``max_bytes``."""
        if self.trusted(sandbox, fresh=fresh):
            parent, name = path.rstrip("/").rsplit("/", 1)
            skip = ("--anchored", *(f"--exclude={name}/{e}" for e in exclude)) if exclude else ()
            run = await self._tar_out(sandbox, parent or "/", name, max_bytes, timeout, skip)
            if run.stdout_truncated:
                too_big = f"{path} in the sandbox is over {max_bytes} bytes as a tarball"
                raise FileTooLarge(too_big, container_id=sandbox.container_id)
            # GNU tar exits 1 when a file changed while it was read (the archive is whole).
            if run.exit_code in (0, 1) and run.stdout and not run.timed_out:
                return run.stdout
            if run.exit_code not in NO_TAR and run.timed_out:
                raise ReadTimedOut(f"{path} could not be read within {timeout:g} s")
        if exclude:
            return await self._read_around(sandbox, path, max_bytes, exclude)
        return await self.runtime.get_archive(sandbox.container_id, path, max_bytes)

    async def _read_around(self, sandbox: Sandbox, path: str, max_bytes: int, exclude: Sequence[str]) -> bytes:
        """``path`` read by the engine (which cannot leave anything out) around the excluded
        paths: each entry of a folder on the way to one is read on its own. The entries are listed
        by the sandbox's agent, which the episode may have subverted: a name it hides reads as
        deleted (the agent could delete it anyway), a name it makes up does not exist."""
        name = posixpath.basename(path.rstrip("/"))
        archives: list[tuple[str, bytes]] = []
        folders: list[str] = []  # on the way to an excluded path: members of their own
        left = max_bytes

        async def walk(rel: str) -> None:
            nonlocal left
            here = posixpath.join(path, rel) if rel else path
            entries, truncated = await sandbox.list_dir(here, max_entries=READ_AROUND_ENTRIES)
            if truncated:
                raise _TooMany
            folders.append(rel)
            for entry in entries:
                base = posixpath.basename(entry.path)
                if base in ("", ".", ".."):
                    continue  # not an entry: a subverted agent's answer
                child = posixpath.join(rel, base) if rel else base
                if child in exclude:
                    continue
                if entry.type == "dir" and ancestor_of_any(child, set(exclude)):
                    await walk(child)
                    continue
                try:
                    data = await self._engine_read(sandbox, posixpath.join(path, child), left)
                except ContainerNotFound:
                    continue  # gone since it was listed, or never there
                archives.append((posixpath.join(name, rel), data))
                left -= len(data)

        try:
            await walk("")
        except _TooMany:  # more entries than reads worth making: all of it, the excluded included
            return await self.runtime.get_archive(sandbox.container_id, path, max_bytes)
        return await asyncio.to_thread(_joined, name, folders, archives)

    async def _engine_read(self, sandbox: Sandbox, path: str, left: int) -> bytes:
        if left < 0:
            raise FileTooLarge(f"{path} in the sandbox is past the grading limit", container_id=sandbox.container_id)
        return await self.runtime.get_archive(sandbox.container_id, path, left)

    @staticmethod
    async def _tar_out(
        sandbox: Sandbox, directory: str, member: str, max_bytes: int, timeout: float, options: tuple[str, ...] = ()
    ) -> ExecResult:
        """``member`` of ``directory`` as a tarball on stdout, by the sandbox's tar, as root; cut
        (and tar ended) past ``max_bytes``. ``options``: GNU tar's ``--anchored --exclude=member/x``
        (busybox's tar has neither: it fails, and the engine reads)."""
        req = ExecRequest(
            argv=("tar", "-c", "-f", "-", "-C", directory, *options, member),
            cwd="/",
            env=TAR_ENV,
            timeout=timeout,
            stdout_cap=max_bytes + 1,
            stderr_cap=64 << 10,
            as_root=True,
            cap_kills=True,
        )
        return await sandbox.exec(req)

    async def put(self, sandbox: Sandbox, path: str, tar: bytes, *, reused: bool = False, fresh: bool = False) -> None:
        """Extract ``tar`` into ``path``, owned by the sandbox's user: by the sandbox's ``tar``,
        as that user, where nothing of an episode has run (``fresh``), by the engine otherwise;
        ``reused``: a task's workspace, extracted again and again (its re-owned form is kept for
        the engine)."""
        if fresh:
            async with Drop(tar) as drop:
                run = await sandbox.untar(drop, path, timeout=STEP_TIMEOUT, env=TAR_ENV, cwd="/")
            if run.ok:
                return
            if run.exit_code not in NO_TAR:
                detail = run.stderr[-500:].decode("utf-8", errors="replace").strip()
                why = "timed out" if run.timed_out else f"exited with {run.exit_code}"
                raise FailedPrecondition(f"extracting into {path} in the sandbox {why}: {detail}")
        owner = self.owner(sandbox)
        if owner is not None:
            tar = await self._owned_tar(tar, owner) if reused else await asyncio.to_thread(owned_tar, tar, *owner)
        await self.runtime.put_archive(sandbox.container_id, path, tar)

    async def _owned_tar(self, tar: bytes, owner: tuple[int, int]) -> bytes:
        key = (*owner, len(tar), await asyncio.to_thread(hash, tar))  # bytes keep their hash once computed
        hit = self._owned.get(key)
        if hit is not None and (hit[0] is tar or hit[0] == tar):
            self._owned.move_to_end(key)
            return hit[1]
        owned = await asyncio.to_thread(owned_tar, tar, *owner)
        self._owned[key] = (tar, owned)
        while len(self._owned) > OWNED_CACHE:
            self._owned.popitem(last=False)
        return owned

    async def prepare(self, sandbox: Sandbox, task: Task, *, reset_git: bool = True) -> None:
        """Put the task's workspace in place and run its setup commands.

        Raises:
            TaskSetupFailed: a command exited non-zero or timed out (the output says why).
        """
        ws = task.spec.workspace
        reset = reset_git and ws.git == "reset"
        based = False
        if ws.source == "bundle":
            # Nothing of an episode has run here yet: a folder already there (the image's, or a
            # recycled sandbox's workdir) is the one to fill. Asking is an agent call; a mkdir is a
            # process (~2 ms of CPU as the episode's user, twice per graded episode).
            [st] = await sandbox.stat([ws.path])
            if st.type != "dir":
                await self._run(sandbox, ExecRequest(argv=("mkdir", "-p", ws.path), timeout=STEP_TIMEOUT), "create the workspace")
            if task.workspace_tar:
                key = await self._based_key(sandbox, task) if reset else None
                if key is None:
                    await self.put(sandbox, ws.path, task.workspace_tar, reused=True, fresh=True)
                else:
                    await self._put_based(sandbox, task, key)  # its patch applied, its history reset
                    reset = based = True
        if ws.patch and not based:
            await self._apply_start(sandbox, ws.path, ws.patch)
        if reset and not based:
            await self._reset_git(sandbox, ws.path, ws.exclude)
        for command in task.spec.setup:
            await self._run(
                sandbox,
                ExecRequest(shell=command, cwd=ws.path, env=task.spec.env, timeout=task.spec.setup_timeout),
                f"run setup {command!r}",
            )

    async def _reset_git(self, sandbox: Sandbox, path: str, exclude: Sequence[str] = ()) -> None:
        """One commit, the base: whatever history the workspace had (with the fix in it) is gone.
        The ``exclude``d paths (the image's, not the project's) stay out of it, and of `git status`."""
        git = " ".join(shlex.quote(a) for a in GIT_IDENTITY)
        ignore = " && mkdir -p .git/info" if exclude else ""
        ignore += "".join(f" && echo {shlex.quote('/' + e)} >> .git/info/exclude" for e in exclude)
        script = (
            f"if command -v git >/dev/null 2>&1; then rm -rf .git && git init -q{ignore} && git add -A && "
            f"git {git} commit -q --allow-empty -m 'rlsandbox: task base'; fi"
        )
        req = ExecRequest(shell=script, cwd=path, env=GIT_DATES, timeout=STEP_TIMEOUT)
        await self._run(sandbox, req, "reset the git history")

    async def _apply_start(self, sandbox: Sandbox, path: str, patch: str) -> None:
        """The task's starting-state patch (``workspace.patch``), by git or else by patch(1). One
        whose reverse applies is already in place (an image built at the patched commit): kept."""
        data = patch.encode()
        for argv in (("git", "apply", "--whitespace=nowarn", "-"), ("patch", "-p1", "--forward", "--batch", "--quiet")):
            run = await sandbox.exec(ExecRequest(argv=argv, cwd=path, stdin=data, timeout=STEP_TIMEOUT))
            if run.ok:
                return
            if run.exit_code in NO_TAR:  # no such tool in the image: the next one
                continue
            check = (
                ("git", "apply", "--reverse", "--check", "-")
                if argv[0] == "git"
                else ("patch", "-p1", "--reverse", "--dry-run", "--batch", "--quiet")
            )
            again = await sandbox.exec(ExecRequest(argv=check, cwd=path, stdin=data, timeout=STEP_TIMEOUT))
            if again.ok:
                return
            tail = (run.stdout[-1500:] + run.stderr[-1500:]).decode("utf-8", errors="replace").strip()
            raise TaskSetupFailed(f"task setup: the workspace patch does not apply ({' '.join(argv[:2])}): {tail}")
        raise TaskSetupFailed("task setup: the workspace patch needs git or patch in the image, and it has neither")

    async def _put_based(self, sandbox: Sandbox, task: Task, key: tuple[object, ...]) -> None:
        """The task's workspace with its git history reset: extracted from what an earlier session
        of the task on this image made, or made here (and kept) when none did. One sandbox makes
        it at a time: the others of a group prepared at once wait for it instead of all running git."""
        path, tar = task.spec.workspace.path, task.workspace_tar
        other = self._making.get(key)
        if other is not None:
            await asyncio.shield(other)
        making = None
        hit = self._based.get(key)
        if hit is not None and (hit[0] is tar or hit[0] == tar):
            self._based.move_to_end(key)
            if hit[1]:
                await self.put(sandbox, path, hit[1], reused=True, fresh=True)
                if hit[2]:  # no git in the image: no index, nothing to refresh
                    # The index's stat data are the first sandbox's: refreshed, `git diff` in the
                    # episode does not re-read every file.
                    refresh = ("git", "update-index", "-q", "--refresh")
                    await sandbox.exec(ExecRequest(argv=refresh, cwd=path, timeout=STEP_TIMEOUT))
                self.based_hits += 1
                return
            # else known not to be kept (too big once reset): reset here, read nothing
        elif key not in self._making:
            making = self._making[key] = asyncio.get_running_loop().create_future()
        try:
            await self.put(sandbox, path, tar, reused=True, fresh=True)
            if task.spec.workspace.patch:
                await self._apply_start(sandbox, path, task.spec.workspace.patch)
            await self._reset_git(sandbox, path, task.spec.workspace.exclude)
            if making is not None:
                await self._keep_based(sandbox, path, key, tar)
        finally:
            if making is not None:
                del self._making[key]
                making.set_result(None)

    async def _based_key(self, sandbox: Sandbox, task: Task) -> tuple[object, ...] | None:
        pool = self.pools.get(sandbox.pool)
        tar = task.workspace_tar
        if pool is None or not tar or len(tar) > BASED_MAX_BYTES or not self.based_budget:
            return None
        digest = await asyncio.to_thread(hash, tar)  # bytes keep their hash once computed
        ws = task.spec.workspace
        return (pool.spec.container.image, self.owner(sandbox), ws.path, ws.patch, tuple(ws.exclude), len(tar), digest)

    async def _keep_based(self, sandbox: Sandbox, path: str, key: tuple[object, ...], tar: bytes) -> None:
        """Read the workspace its git reset just made (a sandbox being prepared: only the daemon's
        commands have run there) and keep it for the task's next sessions on this image. One that
        is too big once reset is remembered as such (its next sessions reset git themselves)."""
        cap = min(2 * BASED_MAX_BYTES, max(self.based_budget - len(tar), 0))
        run = await self._tar_out(sandbox, path, ".", cap, STEP_TIMEOUT)
        if not run.ok and not run.stdout_truncated:
            return  # no tar in the image, say: the next session tries again
        based = b"" if run.stdout_truncated else run.stdout
        # Both tarballs count: the task's is held to compare (a task dropped by the trainer lives on here).
        old = self._based.pop(key, None)
        if old is not None:
            self._based_bytes -= len(old[0]) + len(old[1])
        self._based[key] = (tar, based, b"./.git/index\0" in based)
        self._based_bytes += len(tar) + len(based)
        while self._based and (self._based_bytes > self.based_budget or len(self._based) > BASED_ENTRIES):
            _, (dropped_tar, dropped, _) = self._based.popitem(last=False)
            self._based_bytes -= len(dropped_tar) + len(dropped)

    async def _run(self, sandbox: Sandbox, req: ExecRequest, what: str) -> ExecResult:
        result = await sandbox.exec(req)
        if not result.ok:
            tail = (result.stdout[-1500:] + result.stderr[-1500:]).decode("utf-8", errors="replace")
            why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
            raise TaskSetupFailed(f"task setup: could not {what}: {why}: {tail.strip()}")
        return result


def _joined(name: str, folders: list[str], archives: list[tuple[str, bytes]]) -> bytes:
    """One tarball in the engine's layout (members under ``name``) from the engine's archives of
    single entries (each named relative to its folder, ``(folder, tarball)``), with ``folders``
    (relative to ``name``) as members of their own."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as joined:
        for rel in folders:
            info = tarfile.TarInfo(posixpath.join(name, rel) if rel else name)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            joined.addfile(info)
        for folder, data in archives:
            with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
                for member in tar:
                    member.name = posixpath.join(folder, member.name)
                    if member.islnk():
                        member.linkname = posixpath.join(folder, member.linkname)
                    joined.addfile(member, tar.extractfile(member) if member.isfile() else None)
    return out.getvalue()
