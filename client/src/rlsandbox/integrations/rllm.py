"""rLLM's ``Sandbox`` protocol (``rllm.sandbox.protocol.Sandbox``: sync ``exec``, ``upload_file``,
``upload_dir``, ``start_agent_process``, ``get_endpoint``, ``close``) on an rlsandbox session.

rLLM picks its built-in backends by name; any other sandbox goes in through the flow's
``set_sandbox`` (the flow then leaves closing it to you)::

    from rlsandbox.integrations.rllm import RlsandboxSandbox

    sandbox = RlsandboxSandbox(name="task-1", image="my-image", target="127.0.0.1:7420")
    # or task=spec: the session starts from the task's workspace, and grade() scores it
    flow = MyFlow(...).create_instance()
    flow.set_sandbox(sandbox)
    try:
        episode = flow.run(task, config)
        grade = sandbox.grade()       # reward None: an infra error, mask the sample
    finally:
        sandbox.close()

- ``exec(command, timeout, user)`` runs ``bash -c command`` and returns its stdout; a non-zero
  exit raises ``RuntimeError`` with the stderr's tail, as rLLM's Docker backend does. Each call
  carries a step number, so a call the client retries after a lost connection never runs twice.
  ``user`` runs it through ``runuser -u`` (a root session only).
- ``upload_file``/``upload_dir`` copy from the trainer's machine into the sandbox (a tar through
  the command's stdin: modes and symlinks kept, up to 64 MiB a call); ``download_dir`` copies a
  directory's regular files out, never writing outside the target folder (the sandbox is
  untrusted: links, devices and paths that climb out are skipped).
- ``start_agent_process`` starts a detached background process in the sandbox. ``get_endpoint``
  raises ``NotImplementedError``: rlsandbox sandboxes have no network, so rLLM's worker-server
  orchestration (an HTTP server inside the sandbox) does not apply; run the agent flow in the
  trainer, with the sandbox injected, as above.
- A lost sandbox raises :class:`rlsandbox.client.SandboxRPCError` naming the node.

Checked against rLLM's published protocol (rllm has no distribution for Python 3.11 on PyPI),
with a real daemon: docs/INTEGRATIONS.md.
"""

from __future__ import annotations

import shlex
from typing import Any, Dict, List, Mapping, Optional, Tuple

from rlsandbox.client import Client, ExecResult, GradeResult, Session
from rlsandbox.integrations import transfer
from rlsandbox.integrations.tools import session_options


class RlsandboxSandbox:
    def __init__(
        self,
        name: str = "",
        image: str = "",
        *,
        target: str = "127.0.0.1:7420",
        pool: str = "",
        task: Any = None,
        labels: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: str = "",
        client: Optional[Client] = None,
        **_backend_kwargs: Any,
    ) -> None:
        labels = {**({"sandbox": name} if name else {}), **dict(labels or {})}
        options = session_options(image=image, pool=pool, task=task, labels=labels, env=env, workdir=workdir)
        self.name = name
        self._own_client = client is None
        self.client = client or Client(target)
        try:
            self.session: Optional[Session] = self.client.create_session(pool, **options)
        except BaseException:
            self._close_client()
            raise
        self._seq = 0

    def _open(self) -> Session:
        if self.session is None:
            raise RuntimeError(f"sandbox {self.name or '(unnamed)'} is closed")
        return self.session

    def _run(self, argv: List[str], *, timeout: Optional[float] = None, user: Optional[str] = None, **options: Any) -> ExecResult:
        """Runs argv: its result when it exits 0, RuntimeError otherwise."""
        if user not in (None, "", "root"):
            argv = ["runuser", "-u", str(user), "--", *argv]
        self._seq += 1
        result = self._open().exec(argv, timeout=float(timeout or 0), seq=self._seq, **options)
        if not result.ok:
            if result.timed_out:
                status = "timed out"
            elif result.exit_code is None:
                status = f"killed by signal {result.signal}"
            else:
                status = f"exit {result.exit_code}"
            tail = result.stderr_text[-600:]
            where = self.name or self._open().id
            raise RuntimeError(f"Command failed ({status}) in sandbox {where}: {argv[-1][:200]}\nstderr (tail):\n{tail}")
        return result

    def exec(self, command: str, timeout: Optional[float] = None, user: Optional[str] = None) -> str:
        return self._run(["bash", "-c", command], timeout=timeout, user=user).stdout_text

    def upload_file(self, local_path: str, remote_path: str) -> None:
        self.upload_dir(local_path, remote_path)

    def upload_dir(self, local_path: str, remote_path: str) -> None:
        """Copies a file or a directory tree to ``remote_path`` (created, parents too)."""
        argv, data = transfer.upload(local_path, remote_path)
        self._run(argv, stdin=data)

    def download_dir(self, remote_path: str, local_path: str) -> List[str]:
        """Copies the regular files under ``remote_path`` into ``local_path``; returns their paths."""
        result = self._run(transfer.download(remote_path), stdout_cap=transfer.MAX_TRANSFER)
        return transfer.downloaded(result, remote_path, local_path)

    def start_agent_process(self, command: str, port: int) -> None:
        """Starts ``command`` detached (its output in /tmp/agent-<port>.log); returns at once."""
        log = f"/tmp/agent-{int(port)}.log"
        self._run(["bash", "-c", f"setsid nohup bash -c {shlex.quote(command)} > {log} 2>&1 < /dev/null &"])

    def get_endpoint(self, port: int) -> Tuple[str, Dict[str, str]]:
        raise NotImplementedError(
            "rlsandbox sandboxes have no network: nothing outside can reach a port inside. Run the agent "
            "flow in the trainer with this sandbox injected (flow.set_sandbox(sandbox)) instead of rLLM's "
            "worker-server orchestration."
        )

    def is_alive(self) -> bool:
        if self.session is None:
            return False
        try:
            return self.client.get_session(self.session.id).state == "ready"
        except Exception:
            return False

    def grade(self) -> GradeResult:
        """The session's grade by its task, in a clean room (reward None: an infra error)."""
        return self._open().grade()

    def close(self) -> None:
        session, self.session = self.session, None
        try:
            if session is not None:
                session.close()
        finally:
            if session is not None:
                self._close_client()

    def _close_client(self) -> None:
        if self._own_client:
            self.client.close()

    def __enter__(self) -> RlsandboxSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def create_rlsandbox_sandbox(name: str, image: str = "", **kwargs: Any) -> RlsandboxSandbox:
    """A factory with rLLM's backend factories' signature (``sandbox_factory(name=, image=)``)."""
    return RlsandboxSandbox(name=name, image=image, **kwargs)
