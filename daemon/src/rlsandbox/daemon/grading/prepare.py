"""Task workspaces in sandboxes: the workspace put in place (owned by the sandbox's user where
commands do not run as root), the git history reset to one commit, the task's setup run."""

from __future__ import annotations

import asyncio
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
GIT_IDENTITY = ("-c", "user.name=rlsandbox", "-c", "user.email=rlsandbox@localhost", "-c", "commit.gpgsign=false")


class Workspaces:
    def __init__(self, runtime: DockerRuntime, pools: Mapping[str, WarmPool]) -> None:
        self.runtime = runtime
        self.pools = pools

    def owner(self, sandbox: Sandbox) -> tuple[int, int] | None:
        """(uid, gid) the sandbox's commands run as, when not root (recycling pools)."""
        pool = self.pools.get(sandbox.pool)
        run_as = pool.spec.container.run_as if pool is not None else ""
        if not run_as:
            return None
        uid, _, gid = run_as.partition(":")
        return int(uid), int(gid or uid)

    async def put(self, sandbox: Sandbox, path: str, tar: bytes) -> None:
        """Extract ``tar`` into ``path`` through the engine, owned by the sandbox's user."""
        owner = self.owner(sandbox)
        if owner is not None:
            tar = await asyncio.to_thread(owned_tar, tar, *owner)
        await self.runtime.put_archive(sandbox.container_id, path, tar)

    async def prepare(self, sandbox: Sandbox, task: Task, *, reset_git: bool = True) -> None:
        """Put the task's workspace in place and run its setup commands.

        Raises:
            TaskSetupFailed: a command exited non-zero or timed out (the output says why).
        """
        ws = task.spec.workspace
        if ws.source == "bundle":
            await self._run(sandbox, ExecRequest(argv=("mkdir", "-p", ws.path), timeout=STEP_TIMEOUT), "create the workspace")
            if task.workspace_tar:
                await self.put(sandbox, ws.path, task.workspace_tar)
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
