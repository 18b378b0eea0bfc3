"""slime's agent ``Sandbox`` (``slime.agent.sandbox.Sandbox``: an async context manager with
``exec``, ``write_file`` and ``read_file``) on an rlsandbox session.

Where a slime rollout opens its provider's sandbox (``async with E2BSandbox(image) as sb``), open
this one instead::

    from rlsandbox.integrations.slime import RlsandboxSandbox

    async with RlsandboxSandbox(image, target="127.0.0.1:7420", labels={"run": "my-run"}) as sb:
        code, out, err = await sb.exec("cd /testbed && git status")
        ...
        reward = await sb.reward()      # the clean-room grade; None for an infra error: abort the sample

``image`` (a container image the node makes a pool for), ``task=`` (a task spec or Prefetch ref:
the session starts from its workspace, and ``reward()`` grades it) or ``pool=`` picks the sandbox;
``client=`` shares one :class:`rlsandbox.client.AsyncClient` (TLS, a token, a cluster client).

- ``exec`` returns slime's ``(exit_code, stdout, stderr)``. A command killed by a signal exits
  ``128 + signal``; one past its ``timeout`` exits 124 (as ``timeout(1)``) with a line in stderr.
  ``check=True`` raises ``RuntimeError`` on a non-zero exit, as slime's backends do. Each call
  carries a step number (``seq``), so a call the client retries after a lost connection never
  runs twice: slime's ``idempotent`` hint (is a replay safe?) is accepted and needs nothing more.
- ``user``: ``"root"`` (slime's default) runs as the session's own user: root in a fresh pool, the
  unprivileged episode user in a recycling pool (which no call can leave). Another name runs the
  command through ``runuser -u <name>``, which only a root session can do (otherwise the command
  fails with runuser's message, as a real ``su`` would).
- ``read_file`` returns ``""`` for a file it cannot read, as slime's backends do.
- A lost sandbox raises :class:`rlsandbox.client.SandboxRPCError` (its message names the node and
  what to do): slime's way of dropping a sample is the exception out of the rollout.

Checked against slime's ``Sandbox`` protocol as published (``slime/agent/sandbox.py`` of
2026-08; slime is not on PyPI: the package of that name there is an unrelated placeholder), with
a real daemon, including the detached-command pattern of slime's ``exec_and_wait``:
docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Union

from rlsandbox.client import AsyncClient, AsyncSession, GradeResult, SandboxRPCError
from rlsandbox.integrations import tools
from rlsandbox.integrations.tools import ExecOutcome, outcome, session_options

FileContent = Union[str, bytes, Path]


class RlsandboxSandbox:
    """One rlsandbox session per ``async with``: slime's ``Sandbox`` protocol."""

    def __init__(
        self,
        image: str = "",
        *,
        target: str = "127.0.0.1:7420",
        pool: str = "",
        task: Any = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: str = "",
        client: Optional[AsyncClient] = None,
    ) -> None:
        self.pool = pool
        self.options = session_options(image=image, pool=pool, task=task, labels=labels, env=env, workdir=workdir)
        self._own_client = client is None
        self.client = client or AsyncClient(target)
        self.session: Optional[AsyncSession] = None
        self.sandbox_id = ""
        self._seq = 0

    async def __aenter__(self) -> RlsandboxSandbox:
        try:
            self.session = await self.client.create_session(self.pool, **self.options)
        except BaseException:
            await self._close_client()
            raise
        self.sandbox_id = self.session.id
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            if self.session is not None:
                await self.session.close()
        finally:
            self.session = None
            await self._close_client()

    async def _close_client(self) -> None:
        if self._own_client:
            await self.client.close()

    def _open(self) -> AsyncSession:
        if self.session is None:
            raise RuntimeError("the sandbox is not open: use it inside 'async with'")
        return self.session

    async def exec(
        self,
        cmd: str,
        *,
        user: str = "root",
        env: Optional[Dict[str, str]] = None,
        timeout: int = 120,
        check: bool = False,
        idempotent: bool = True,
    ) -> ExecOutcome:
        # ``idempotent`` is slime's hint for a transport retry; every call here carries a step
        # number, so a retried call is never run twice, whether the command could be or not.
        session = self._open()
        self._seq += 1
        try:
            result = await session.exec(
                _as_user(["bash", "-c", cmd], user), env=dict(env or {}), timeout=float(timeout), seq=self._seq
            )
        except SandboxRPCError as e:
            died = tools.died(e)  # the episode killed its sandbox: a failed command, graded 0 later
            if died is None:
                raise
            result = died
        code, out, err = outcome(result)
        if check and code != 0:
            raise RuntimeError(f"rlsandbox exec failed (exit={code}): {cmd[:120]}\n{err[-400:]}")
        return code, out, err

    async def write_file(self, sandbox_path: str, content: FileContent, *, user: str = "root") -> None:
        data = content.read_bytes() if isinstance(content, Path) else content
        await self._open().write_files({sandbox_path: data})
        if user != "root":
            await self.exec(f"chown {shlex.quote(user)}: {shlex.quote(sandbox_path)}", check=True)

    async def read_file(self, sandbox_path: str, *, user: str = "root") -> str:
        found = (await self._open().read_files([sandbox_path])).get(sandbox_path)
        if found is None or found.error:
            return ""
        return found.data.decode("utf-8", errors="replace")

    async def grade(self) -> GradeResult:
        """The session's grade by its task, in a clean room."""
        return await self._open().grade()

    async def reward(self) -> Optional[float]:
        """The reward of the episode, or None for an infra error (abort the sample, do not score it)."""
        grade = await self.grade()
        return None if grade.reward is None else float(grade.reward)


def _as_user(argv: list, user: str) -> list:
    return argv if user in ("", "root") else ["runuser", "-u", user, "--", *argv]
