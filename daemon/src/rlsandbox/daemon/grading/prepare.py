"""Task workspaces in sandboxes: the workspace put in place (owned by the sandbox's user where
commands do not run as root), the git history reset to one commit, the task's setup run."""

from __future__ import annotations

import asyncio
import collections
import shlex
from collections.abc import Mapping

from rlsandbox.daemon.grading.room import TaskSetupFailed
from rlsandbox.daemon.grading.task import Task
from rlsandbox.daemon.grading.workspace import owned_tar
from rlsandbox.daemon.model import ExecRequest, ExecResult
from rlsandbox.daemon.pool import WarmPool
from rlsandbox.daemon.runtime.docker import DockerRuntime
from rlsandbox.daemon.sandbox import Sandbox

STEP_TIMEOUT = 60.0
OWNED_CACHE = 4  # task workspaces (32 MB at most each) kept re-owned for a recycling pool's user
GIT_IDENTITY = ("-c", "user.name=rlsandbox", "-c", "user.email=rlsandbox@localhost", "-c", "commit.gpgsign=false")


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

    async def put(self, sandbox: Sandbox, path: str, tar: bytes, *, reused: bool = False) -> None:
        """Extract ``tar`` into ``path`` through the engine, owned by the sandbox's user;
        ``reused``: a task's workspace, extracted again and again (its re-owned form is kept)."""
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
                await self.put(sandbox, ws.path, task.workspace_tar, reused=True)
        if reset_git and ws.git == "reset":
            # One commit, the base: whatever history the workspace had (with the fix in it) is gone.
            git = " ".join(shlex.quote(a) for a in GIT_IDENTITY)
            script = (
                "if command -v git >/dev/null 2>&1; then rm -rf .git && git init -q && git add -A && "
                f"git {git} commit -q --allow-empty -m 'rlsandbox: task base'; fi"
            )
            await self._run(sandbox, ExecRequest(shell=script, cwd=ws.path, timeout=STEP_TIMEOUT), "reset the git history")
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
