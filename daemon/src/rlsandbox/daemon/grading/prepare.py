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
import shlex
from collections.abc import Mapping

from rlsandbox.daemon.agent.socket_transport import Drop
from rlsandbox.daemon.errors import FailedPrecondition, FileTooLarge
from rlsandbox.daemon.grading.room import TaskSetupFailed
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.grading.workspace import owned_tar
from rlsandbox.daemon.model import ExecRequest, ExecResult
from rlsandbox.daemon.pool import WarmPool
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.sandbox import Sandbox

STEP_TIMEOUT = 60.0
OWNED_CACHE = 4  # task workspaces (32 MB at most each) kept re-owned for a recycling pool's user
# The sandbox's own tar: the image's, found on the system folders only (an episode may write
# elsewhere), with no options from the environment.
TAR_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "TAR_OPTIONS": "", "LC_ALL": "C"}
NO_TAR = (126, 127)  # the image has no tar: the engine does it
# No background "git maintenance run --auto" after the commit: nothing to maintain in a one-commit
# history (it showed in the CPU samples of a node preparing tasks).
GIT_IDENTITY = (
    "-c", "user.name=rlsandbox", "-c", "user.email=rlsandbox@localhost", "-c", "commit.gpgsign=false",
    "-c", "maintenance.auto=false", "-c", "gc.auto=0",
)  # fmt: skip


# The base commit's dates are fixed: every session of a task (and every fork of a fresh one) has
# the same HEAD, whenever it was prepared.
GIT_DATES = {"GIT_AUTHOR_DATE": "2000-01-01T00:00:00+0000", "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+0000"}


class ReadTimedOut(FailedPrecondition):
    """A workspace took longer than STEP_TIMEOUT to read (its contents decide how long: a policy
    that fills its workspace with millions of files must score, not be masked as infra)."""


class Workspaces:
    def __init__(self, runtime: DockerRuntime, pools: Mapping[str, WarmPool]) -> None:
        self.runtime = runtime
        self.pools = pools
        # Task workspaces re-owned for a pool's user, by (uid, gid, size, hash): every session of a
        # task (and every clean room, every prefetched sandbox) would otherwise re-pack the same tar.
        self._owned: collections.OrderedDict[tuple[int, int, int, int], tuple[bytes, bytes]] = collections.OrderedDict()

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

    async def read(self, sandbox: Sandbox, path: str, max_bytes: int, *, fresh: bool, timeout: float = STEP_TIMEOUT) -> bytes:
        """The folder ``path`` as a tarball, members under the folder's own name (the engine's
        layout), read by the sandbox's ``tar`` running as the agent's user where ``trusted``, by
        the engine otherwise. Raises FileTooLarge past ``max_bytes``."""
        if self.trusted(sandbox, fresh=fresh):
            parent, name = path.rstrip("/").rsplit("/", 1)
            run = await sandbox.exec(
                ExecRequest(
                    argv=("tar", "-c", "-f", "-", "-C", parent or "/", name),
                    cwd="/",
                    env=TAR_ENV,
                    timeout=timeout,
                    stdout_cap=max_bytes + 1,
                    stderr_cap=64 << 10,
                    as_root=True,
                    cap_kills=True,
                )
            )
            if run.stdout_truncated:
                too_big = f"{path} in the sandbox is over {max_bytes} bytes as a tarball"
                raise FileTooLarge(too_big, container_id=sandbox.container_id)
            # GNU tar exits 1 when a file changed while it was read (the archive is whole).
            if run.exit_code in (0, 1) and run.stdout and not run.timed_out:
                return run.stdout
            if run.exit_code not in NO_TAR and run.timed_out:
                raise ReadTimedOut(f"{path} could not be read within {timeout:g} s")
        return await self.runtime.get_archive(sandbox.container_id, path, max_bytes)

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
        if ws.source == "bundle":
            await self._run(sandbox, ExecRequest(argv=("mkdir", "-p", ws.path), timeout=STEP_TIMEOUT), "create the workspace")
            if task.workspace_tar:
                await self.put(sandbox, ws.path, task.workspace_tar, reused=True, fresh=True)
        if reset_git and ws.git == "reset":
            # One commit, the base: whatever history the workspace had (with the fix in it) is gone.
            git = " ".join(shlex.quote(a) for a in GIT_IDENTITY)
            script = (
                "if command -v git >/dev/null 2>&1; then rm -rf .git && git init -q && git add -A && "
                f"git {git} commit -q --allow-empty -m 'rlsandbox: task base'; fi"
            )
            await self._run(
                sandbox, ExecRequest(shell=script, cwd=ws.path, env=GIT_DATES, timeout=STEP_TIMEOUT), "reset the git history"
            )
        for command in task.spec.setup:
            await self._run(
                sandbox, ExecRequest(shell=command, cwd=ws.path, timeout=task.spec.setup_timeout), f"run setup {command!r}"
            )

    async def _run(self, sandbox: Sandbox, req: ExecRequest, what: str) -> ExecResult:
        result = await sandbox.exec(req)
        if not result.ok:
            tail = (result.stdout[-1500:] + result.stderr[-1500:]).decode("utf-8", errors="replace")
            why = "timed out" if result.timed_out else f"exited with {result.exit_code}"
            raise TaskSetupFailed(f"task setup: could not {what}: {why}: {tail.strip()}")
        return result
